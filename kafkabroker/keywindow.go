package kafkabroker

import "sync/atomic"

// keyRecord is what a key window knows of one record: its offset, its
// key, its size in bytes, and whether it is done (finished: handed over
// and acked, or completed by an earlier owner).
type keyRecord struct {
	off  int64
	key  string
	size int
	done bool
}

// windowed is a record a keyWindow holds: the caller's own type, which
// embeds a keyRecord (keyed.go's keyDelivery; the tests' own records).
type windowed interface {
	record() *keyRecord
}

// keyWindow is the bookkeeping of one partition in consumer key, with no
// Kafka client in it: records go in by offset, key and size; out come the
// decisions (which record to hand over now, which waits behind its key,
// the watermark to commit, whether to pause reading).
//
// A record goes through three stages:
//
//   - read ahead (read): read from the broker, waiting for room in the
//     window. Reading pauses when the read-ahead holds readAheadFactor
//     times maxMsgs records or maxBytes bytes, and resumes once it is
//     down to half of that (pauseChange).
//   - in the window (admitNext, enter): not yet done. At most maxMsgs
//     records and maxBytes bytes, except that a record larger than the
//     whole window is admitted alone. Per key, one record is handed over
//     at a time (claimKey); the others wait behind it, in offset order,
//     until it is done (nextOfKey).
//   - done, kept as an offset until the commit passes it (commit). At
//     most maxSpan records are entered and not known committed, done
//     ones included.
//
// The watermark is the offset after the contiguous done records: the
// offset to commit, never past a record that is not done.
//
// A keyWindow is owned by one goroutine; only the fill it publishes
// (inWindow, readAheadFill) may be read by others.
type keyWindow[R windowed] struct {
	maxMsgs  int // records in the window
	maxBytes int // their bytes; also the read-ahead's bytes
	maxSpan  int // records entered and not known committed

	next  int64 // offset after the last record entered
	win   []R   // records entered and not known committed, in offset order
	head  int   // first record of win not known committed
	mark  int   // first record of win not done
	count int   // records in the window: not done
	bytes int   // their bytes
	lanes map[string]*keyLane[R]

	ahead      []R // read ahead, waiting for room in the window
	aheadBytes int
	paused     bool

	// The fill, published for the tracker's gauges.
	fill, fillBytes   atomic.Int64
	aheadN, aheadByte atomic.Int64
}

// keyLane is one key's order: a record of the key is handed over, and
// these wait behind it.
type keyLane[R any] struct {
	waiting []R
}

// spanFactor is how many times the window's records may be read and not
// yet committed, finished ones included: a slow record at the watermark
// lets the records behind it finish and leave the window, up to this
// bound, which also bounds what a crash makes the next owner repeat and
// the commit metadata that lists the finished ones.
const spanFactor = 8

// spanLimit is the span of a window of msgs records: spanFactor times
// it, within what the commit metadata can describe.
func spanLimit(msgs int) int {
	return max(1, min(spanFactor*msgs, maxCompletedSpan))
}

// readAheadFactor is how many times the window's records may be read
// ahead of it: read and waiting for room in the window.
const readAheadFactor = 32

// newKeyWindow returns the window of a partition read from offset first,
// holding at most msgs records and bytes bytes.
func newKeyWindow[R windowed](msgs, bytes int, first int64) *keyWindow[R] {
	return &keyWindow[R]{
		maxMsgs:  msgs,
		maxBytes: bytes,
		maxSpan:  spanLimit(msgs),
		next:     first,
		lanes:    make(map[string]*keyLane[R]),
	}
}

// read queues r, read from the broker, until it fits in the window.
func (w *keyWindow[R]) read(r R) {
	w.ahead = append(w.ahead, r)
	w.aheadBytes += r.record().size
}

// publishReadAhead publishes the read-ahead's fill (readAheadFill); the
// caller does it once per batch read or admitted.
func (w *keyWindow[R]) publishReadAhead() {
	w.aheadN.Store(int64(len(w.ahead)))
	w.aheadByte.Store(int64(w.aheadBytes))
}

// dropReadAhead forgets the records read ahead: they will not be handed
// over (the partition stops).
func (w *keyWindow[R]) dropReadAhead() {
	clear(w.ahead)
	w.ahead, w.aheadBytes = nil, 0
	w.publishReadAhead()
}

// span is the records entered and not known committed.
func (w *keyWindow[R]) span() int { return len(w.win) - w.head }

// fits reports whether a record of size bytes may enter the window now.
func (w *keyWindow[R]) fits(size int) bool {
	if w.span() >= w.maxSpan {
		return false // a commit makes room
	}
	if w.count == 0 {
		return true // alone, whatever its size
	}
	return w.count < w.maxMsgs && w.bytes+size <= w.maxBytes
}

// admitNext takes the first record read ahead out of the read-ahead if it
// fits in the window now; ok is false if there is none or it does not
// fit. The caller then enters it (enter), or drops it.
func (w *keyWindow[R]) admitNext() (r R, ok bool) {
	if len(w.ahead) == 0 || !w.fits(w.ahead[0].record().size) {
		return r, false
	}
	r = w.ahead[0]
	var zero R
	w.ahead[0] = zero
	w.ahead = w.ahead[1:]
	w.aheadBytes -= r.record().size
	return r, true
}

// enter counts r in the window.
func (w *keyWindow[R]) enter(r R) {
	rec := r.record()
	w.win = append(w.win, r)
	w.count++
	w.bytes += rec.size
	w.next = rec.off + 1
	w.publishFill()
}

// claimKey reports whether r, entered, may be handed over now: true if no
// record of its key is handed over and not done (r's key is then taken
// until nextOfKey frees it); false if r waits behind its key.
func (w *keyWindow[R]) claimKey(r R) bool {
	key := r.record().key
	if l := w.lanes[key]; l != nil {
		l.waiting = append(l.waiting, r)
		return false
	}
	w.lanes[key] = &keyLane[R]{}
	return true
}

// finish marks r done: it leaves the window; its offset stays until the
// commit passes it.
func (w *keyWindow[R]) finish(r R) {
	rec := r.record()
	rec.done = true
	w.count--
	w.bytes -= rec.size
	w.publishFill()
}

// nextOfKey is called when the record of key that was handed over is done
// (finish): it returns the next record of the key to hand over, or frees
// the key (ok false). A record handed over and never done (abandoned)
// keeps its key taken.
func (w *keyWindow[R]) nextOfKey(key string) (next R, ok bool) {
	l := w.lanes[key]
	if l == nil {
		return next, false
	}
	if len(l.waiting) == 0 {
		delete(w.lanes, key)
		return next, false
	}
	next = l.waiting[0]
	var zero R
	l.waiting[0] = zero
	l.waiting = l.waiting[1:]
	return next, true
}

// eachWaiting calls f with every record waiting behind its key.
func (w *keyWindow[R]) eachWaiting(f func(R)) {
	for _, l := range w.lanes {
		for _, r := range l.waiting {
			f(r)
		}
	}
}

// watermark returns the offset after the contiguous done records: the
// first record not done, or, when all are, the offset after the last
// record entered.
func (w *keyWindow[R]) watermark() int64 {
	for w.mark < len(w.win) && w.win[w.mark].record().done {
		w.mark++
	}
	if w.mark < len(w.win) {
		return w.win[w.mark].record().off
	}
	return w.next
}

// doneBeyond returns the offsets of the records done beyond the
// watermark, in order (what the commit's metadata lists).
func (w *keyWindow[R]) doneBeyond() []int64 {
	var out []int64
	for _, r := range w.win[w.mark:] {
		if rec := r.record(); rec.done {
			out = append(out, rec.off)
		}
	}
	return out
}

// commitUrgent reports whether the span is a quarter full: the commit,
// which frees it, should not wait.
func (w *keyWindow[R]) commitUrgent() bool { return 4*w.span() >= w.maxSpan }

// commit drops the records below offset c, committed and all done, from
// the span.
func (w *keyWindow[R]) commit(c int64) {
	var zero R
	for w.head < w.mark && w.win[w.head].record().off < c {
		w.win[w.head] = zero
		w.head++
	}
	if w.head > 64 && w.head*2 > len(w.win) {
		n := copy(w.win, w.win[w.head:])
		clear(w.win[n:])
		w.win = w.win[:n]
		w.mark -= w.head
		w.head = 0
	}
}

// pauseChange decides whether reading should pause or resume: it pauses
// when the read-ahead is full (readAheadFactor times maxMsgs records, or
// maxBytes bytes), and resumes once the read-ahead is down to half of
// that. changed is false when reading should stay as it is.
//
// Resuming before the read-ahead runs dry is what keeps a partition busy.
// When every partition a broker connection fetches is paused, Sarama's
// fetch loop sleeps 100 ms before it looks again (its
// partitionConsumersBatchTimeout), so a consumer that paused whenever a
// record waited, and resumed once none did, idled through that sleep
// after each fetch: with one partition, most of the time
// (TestKeyReadAheadPausesWithHysteresis; KafkaKeyGoodput's key-1p rows,
// docs/benchmarks.md "Key mode"). Half the read-ahead covers the sleep
// at tens of thousands of light records a second.
func (w *keyWindow[R]) pauseChange() (pause, changed bool) {
	limit, limitBytes := readAheadFactor*w.maxMsgs, w.maxBytes
	if w.paused {
		limit, limitBytes = limit/2, limitBytes/2
	}
	full := len(w.ahead) >= limit || w.aheadBytes >= limitBytes
	if full == w.paused {
		return w.paused, false
	}
	w.paused = full
	return full, true
}

func (w *keyWindow[R]) publishFill() {
	w.fill.Store(int64(w.count))
	w.fillBytes.Store(int64(w.bytes))
}

// inWindow returns the records in the window and their bytes, as last
// published; safe from any goroutine.
func (w *keyWindow[R]) inWindow() (records, bytes int64) {
	return w.fill.Load(), w.fillBytes.Load()
}

// readAheadFill returns the records read ahead and their bytes, as last
// published; safe from any goroutine.
func (w *keyWindow[R]) readAheadFill() (records, bytes int64) {
	return w.aheadN.Load(), w.aheadByte.Load()
}
