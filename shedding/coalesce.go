package shedding

import "sync"

// ticket is one message's registration with the coalescer: the newest
// message of its entity that is waiting for budget or being handled.
type ticket struct {
	key        entityKey
	uuid       string
	version    uint64
	hasVersion bool

	// abort is closed when the message is superseded while it waits, when
	// a composed revocation fires (see Policy.Revoked), and at the latest
	// when the message leaves the policy. Budget admission selects on it.
	abort chan struct{}

	// Guarded by coalescer.mu.
	closed     bool
	superseded bool // a newer message of the entity made this one step aside
	admitted   bool // the message got past admission: it can no longer be superseded
}

// coalescer tracks, per entity, the newest message that has entered the
// policy and not left it yet. Its memory is bounded by the messages in
// flight: an entry is removed when its message leaves.
type coalescer struct {
	mu     sync.Mutex
	latest map[entityKey]*ticket
}

func newCoalescer() *coalescer {
	return &coalescer{latest: make(map[entityKey]*ticket)}
}

// arrival is what register decided about a newcomer.
type arrival uint8

const (
	// arrivedNewest: the newcomer is registered as its entity's newest
	// message (an older waiter, if any, was superseded).
	arrivedNewest arrival = iota
	// arrivedOlder: a newer message of the entity is already in flight,
	// so the newcomer is superseded before it waits at all.
	arrivedOlder
	// arrivedUntracked: the newcomer can be ordered neither way (the same
	// message delivered twice, or the same version); it proceeds without
	// coalescing and nothing else is touched.
	arrivedUntracked
)

// register records a newcomer for key. With versions on both sides the
// higher version wins; otherwise the later arrival does, unless the
// newcomer is a redelivery (a broker redelivery or a retry copy): it was
// first delivered before the message in flight may have been, so without
// versions it cannot be ordered after it and proceeds untracked instead of
// superseding it. supersede says whether an older waiter may be made to
// step aside: only when the admission hook is installed, so that its
// outcome can be told apart from a handled message.
func (c *coalescer) register(key entityKey, uuid string, version uint64, hasVersion, redelivery, supersede bool) (*ticket, arrival) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.latest[key]
	if cur != nil {
		switch {
		case cur.uuid == uuid:
			return nil, arrivedUntracked
		case hasVersion && cur.hasVersion && version < cur.version:
			return nil, arrivedOlder
		case hasVersion && cur.hasVersion && version == cur.version:
			return nil, arrivedUntracked
		case redelivery && !(hasVersion && cur.hasVersion):
			return nil, arrivedUntracked
		}
		if supersede && !cur.admitted && !cur.superseded {
			cur.superseded = true
			c.closeLocked(cur)
		}
	}
	t := &ticket{key: key, uuid: uuid, version: version, hasVersion: hasVersion, abort: make(chan struct{})}
	c.latest[key] = t
	return t, arrivedNewest
}

// admit marks t admitted: from now on it runs to completion. It returns
// false if t was superseded first.
func (c *coalescer) admit(t *ticket) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.superseded {
		return false
	}
	t.admitted = true
	return true
}

// wasSuperseded reports whether t was made to step aside by a newer message.
func (c *coalescer) wasSuperseded(t *ticket) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return t.superseded
}

// revoke closes t's abort channel without marking it superseded: a
// composed revocation (a Kafka session ending) fired.
func (c *coalescer) revoke(t *ticket) {
	c.mu.Lock()
	c.closeLocked(t)
	c.mu.Unlock()
}

// finish removes t when its message leaves the policy, and closes its abort
// channel so that anything still watching it (a revocation merger) stops.
func (c *coalescer) finish(t *ticket) {
	c.mu.Lock()
	if c.latest[t.key] == t {
		delete(c.latest, t.key)
	}
	c.closeLocked(t)
	c.mu.Unlock()
}

func (c *coalescer) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.latest)
}

func (c *coalescer) closeLocked(t *ticket) {
	if !t.closed {
		t.closed = true
		close(t.abort)
	}
}
