package shedding

import "sync"

// entityKey identifies an entity within a topic: versions of the same
// entity id on two topics are unrelated.
type entityKey struct {
	topic, entity string
}

// guardEntry is what the guard remembers about one entity. It sits on an
// intrusive recency list, most recently seen first.
type guardEntry struct {
	key entityKey

	// done is the highest version handled successfully and acked; valid
	// when hasDone.
	done    uint64
	hasDone bool

	// pending is the highest version whose handler succeeded but whose
	// message was not known to be acked yet (the router may still nack it
	// if publishing the handler's output fails). It becomes done once
	// pendingAck is closed, and is never counted before.
	pending    uint64
	pendingAck <-chan struct{}

	prev, next *guardEntry
}

// settle promotes the pending version once its message has been acked.
func (e *guardEntry) settle() {
	if e.pendingAck == nil {
		return
	}
	select {
	case <-e.pendingAck:
		if !e.hasDone || e.pending > e.done {
			e.done, e.hasDone = e.pending, true
		}
		e.pending, e.pendingAck = 0, nil
	default:
	}
}

// versionGuard is a size-bounded LRU map from entity to the last version
// handled for it. It never holds more than limit entries: recording a new
// entity when full forgets the least recently seen one, reusing its entry.
// It is safe for concurrent use.
type versionGuard struct {
	mu      sync.Mutex
	limit   int
	entries map[entityKey]*guardEntry
	head    *guardEntry // most recently seen
	tail    *guardEntry // least recently seen: evicted first
	evicted uint64
}

func newVersionGuard(limit int) *versionGuard {
	if limit <= 0 {
		panic("shedding: version guard limit must be positive")
	}
	// Pre-size moderately: a large limit need not be paid for up front.
	return &versionGuard{limit: limit, entries: make(map[entityKey]*guardEntry, min(limit, 1024))}
}

// stale reports whether version is not newer than the last version handled
// and acked for k. An entity the guard does not remember is never stale.
func (g *versionGuard) stale(k entityKey, version uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entries[k]
	if e == nil {
		return false
	}
	g.touchLocked(e)
	e.settle()
	return e.hasDone && version <= e.done
}

// record notes that the handler of version succeeded for k. The version
// counts once acked is closed (the message was acked); a nil acked counts
// at once. Versions never go backwards.
func (g *versionGuard) record(k entityKey, version uint64, acked <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entries[k]
	if e == nil {
		if len(g.entries) >= g.limit {
			e = g.tail
			g.unlinkLocked(e)
			delete(g.entries, e.key)
			g.evicted++
			*e = guardEntry{}
		} else {
			e = new(guardEntry)
		}
		e.key = k
		g.entries[k] = e
		g.pushFrontLocked(e)
	} else {
		g.touchLocked(e)
		e.settle()
	}
	if e.hasDone && version <= e.done {
		return
	}
	if acked == nil {
		e.done, e.hasDone = version, true
		if e.pendingAck != nil && e.pending <= version {
			e.pending, e.pendingAck = 0, nil
		}
		return
	}
	// Keep the highest unacked version. A lower one it replaces is simply
	// not counted: the guard may forget, it must never over-remember.
	if e.pendingAck == nil || version >= e.pending {
		e.pending, e.pendingAck = version, acked
	}
}

func (g *versionGuard) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.entries)
}

func (g *versionGuard) stats() (entries int, evicted uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.entries), g.evicted
}

func (g *versionGuard) touchLocked(e *guardEntry) {
	if g.head == e {
		return
	}
	g.unlinkLocked(e)
	g.pushFrontLocked(e)
}

func (g *versionGuard) pushFrontLocked(e *guardEntry) {
	e.prev, e.next = nil, g.head
	if g.head != nil {
		g.head.prev = e
	}
	g.head = e
	if g.tail == nil {
		g.tail = e
	}
}

func (g *versionGuard) unlinkLocked(e *guardEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		g.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		g.tail = e.prev
	}
	e.prev, e.next = nil, nil
}
