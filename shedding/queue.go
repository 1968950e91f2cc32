package shedding

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/spillway-go/spillway"
)

// ErrFull is returned by [Queue.Push] on a full queue whose overflow policy
// is [Reject].
var ErrFull = errors.New("shedding: queue full")

// ErrClosed is returned by [Queue.Push] once the queue is closed, and by
// [Queue.Pop] once it is closed and empty.
var ErrClosed = errors.New("shedding: queue closed")

// Overflow is what a full [Queue] does with a new item. There is no
// unbounded option.
type Overflow uint8

const (
	// Block: Push waits for room until its context is done.
	Block Overflow = iota
	// DropNewest: the new item is discarded; the queue is unchanged.
	DropNewest
	// DropOldest: the oldest queued item is discarded to make room.
	DropOldest
	// Reject: Push fails with [ErrFull]; the caller keeps the item.
	Reject
)

var overflowNames = [...]string{Block: "block", DropNewest: "drop_newest", DropOldest: "drop_oldest", Reject: "reject"}

// String returns block, drop_newest, drop_oldest or reject.
func (o Overflow) String() string {
	if int(o) < len(overflowNames) {
		return overflowNames[o]
	}
	return "Overflow(" + strconv.Itoa(int(o)) + ")"
}

// QueueOption configures a [Queue].
type QueueOption[T any] func(*Queue[T])

// OnDrop sets a hook called with every item the queue discards
// ([DropNewest], [DropOldest]), so that it can be released: a dropped
// Watermill message must still be acked or nacked by someone. It is called
// from the pushing goroutine, after the queue's lock is released.
func OnDrop[T any](f func(item T)) QueueOption[T] {
	return func(q *Queue[T]) { q.onDrop = f }
}

// Queue is a bounded FIFO queue for buffering between in-process stages.
// Its capacity is fixed at construction and what happens when it is full
// is its [Overflow] policy. It is safe for concurrent use by any number of
// producers and consumers; Len, Cap, FillRatio, Dropped and Rejected do not
// take its lock.
//
// Blocked callers are woken in arrival order, but a caller that arrives
// while room (or an item) is available takes it at once, ahead of a
// blocked caller that has been woken but not yet run.
type Queue[T any] struct {
	capacity int
	overflow Overflow
	onDrop   func(T)

	mu      sync.Mutex
	buf     []T // ring of capacity items
	head    int // index of the oldest item
	n       int // items queued
	closed  bool
	pushers waitList // blocked in Push (Block only)
	poppers waitList // blocked in Pop

	length   atomic.Int64
	dropped  atomic.Uint64
	rejected atomic.Uint64
}

// NewQueue returns an empty queue of capacity items with the given
// overflow policy. It returns a [*spillway.FieldError] (matching
// [spillway.ErrInvalidConfig]) if capacity is not positive (there is no
// unbounded queue) or overflow is not one of the four policies.
func NewQueue[T any](capacity int, overflow Overflow, opts ...QueueOption[T]) (*Queue[T], error) {
	if capacity <= 0 {
		return nil, &spillway.FieldError{Field: "capacity", Value: strconv.Itoa(capacity), Reason: "must be positive"}
	}
	if int(overflow) >= len(overflowNames) {
		return nil, &spillway.FieldError{Field: "overflow", Value: overflow.String(), Reason: "must be Block, DropNewest, DropOldest or Reject"}
	}
	q := &Queue[T]{capacity: capacity, overflow: overflow, buf: make([]T, capacity)}
	for _, o := range opts {
		if o != nil {
			o(q)
		}
	}
	return q, nil
}

// Push appends item. On a full queue:
//
//   - Block waits for room; it returns ctx.Err() if ctx is done first
//     (the item is not queued) and ErrClosed if the queue is closed.
//   - DropNewest discards item and returns nil.
//   - DropOldest discards the oldest item, queues item and returns nil.
//   - Reject returns ErrFull.
//
// Dropped items go to the OnDrop hook and are counted by Dropped; rejected
// pushes are counted by Rejected. When there is room Push never blocks and
// ignores ctx. Push on a closed queue returns ErrClosed.
func (q *Queue[T]) Push(ctx context.Context, item T) error {
	q.mu.Lock()
	for {
		if q.closed {
			q.mu.Unlock()
			return ErrClosed
		}
		if q.n < q.capacity {
			q.putLocked(item)
			q.poppers.wakeOne()
			q.mu.Unlock()
			return nil
		}
		switch q.overflow {
		case Reject:
			q.rejected.Add(1)
			q.mu.Unlock()
			return ErrFull
		case DropNewest:
			q.dropped.Add(1)
			q.mu.Unlock()
			q.discard(item)
			return nil
		case DropOldest:
			old := q.takeLocked()
			q.putLocked(item)
			q.dropped.Add(1)
			q.mu.Unlock()
			q.discard(old)
			return nil
		}
		// Block.
		if err := q.waitLocked(ctx, &q.pushers); err != nil {
			q.mu.Unlock()
			return err
		}
	}
}

// Pop removes and returns the oldest item, waiting for one until ctx is
// done (it returns ctx.Err()). Once the queue is closed, Pop drains what is
// left and then returns ErrClosed.
func (q *Queue[T]) Pop(ctx context.Context) (T, error) {
	q.mu.Lock()
	for {
		if q.n > 0 {
			item := q.takeLocked()
			q.pushers.wakeOne()
			q.mu.Unlock()
			return item, nil
		}
		if q.closed {
			q.mu.Unlock()
			var zero T
			return zero, ErrClosed
		}
		if err := q.waitLocked(ctx, &q.poppers); err != nil {
			q.mu.Unlock()
			var zero T
			return zero, err
		}
	}
}

// TryPop removes and returns the oldest item if there is one. It never
// blocks.
func (q *Queue[T]) TryPop() (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		var zero T
		return zero, false
	}
	item := q.takeLocked()
	q.pushers.wakeOne()
	return item, true
}

// Close stops the queue accepting items: blocked and later pushes return
// ErrClosed, and Pop returns ErrClosed once the queued items are drained.
// Closing twice is a no-op.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	q.closed = true
	q.pushers.wakeAll()
	q.poppers.wakeAll()
	q.mu.Unlock()
}

// Len returns the number of queued items.
func (q *Queue[T]) Len() int { return int(q.length.Load()) }

// Cap returns the capacity.
func (q *Queue[T]) Cap() int { return q.capacity }

// FillRatio returns Len / Cap, from 0 (empty) to 1 (full).
func (q *Queue[T]) FillRatio() float64 { return float64(q.length.Load()) / float64(q.capacity) }

// Overflow returns the overflow policy.
func (q *Queue[T]) Overflow() Overflow { return q.overflow }

// Dropped returns how many items the queue has discarded (DropNewest and
// DropOldest).
func (q *Queue[T]) Dropped() uint64 { return q.dropped.Load() }

// Rejected returns how many pushes failed with ErrFull (Reject).
func (q *Queue[T]) Rejected() uint64 { return q.rejected.Load() }

func (q *Queue[T]) putLocked(item T) {
	q.buf[(q.head+q.n)%q.capacity] = item
	q.n++
	q.length.Store(int64(q.n))
}

func (q *Queue[T]) takeLocked() T {
	var zero T
	item := q.buf[q.head]
	q.buf[q.head] = zero // let the item be collected
	q.head = (q.head + 1) % q.capacity
	q.n--
	q.length.Store(int64(q.n))
	return item
}

func (q *Queue[T]) discard(item T) {
	if q.onDrop != nil {
		q.onDrop(item)
	}
}

// waitLocked parks the caller on l until it is woken or ctx is done. It is
// called and returns with q.mu held. A nil error means "woken: look again".
func (q *Queue[T]) waitLocked(ctx context.Context, l *waitList) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w := &qwaiter{ready: make(chan struct{}, 1)}
	l.push(w)
	q.mu.Unlock()
	select {
	case <-w.ready:
		q.mu.Lock()
		return nil
	case <-ctx.Done():
		q.mu.Lock()
		if !l.remove(w) {
			// Woken and cancelled at once: the wake-up was meant for
			// someone able to use it, so hand it on.
			l.wakeOne()
		}
		return ctx.Err()
	}
}

// qwaiter is one blocked caller.
type qwaiter struct {
	ready      chan struct{} // buffered(1); receives once when woken
	prev, next *qwaiter
	queued     bool
}

// waitList is a FIFO of blocked callers. It is guarded by the queue's lock.
type waitList struct {
	head, tail *qwaiter
}

func (l *waitList) push(w *qwaiter) {
	w.prev, w.next, w.queued = l.tail, nil, true
	if l.tail == nil {
		l.head = w
	} else {
		l.tail.next = w
	}
	l.tail = w
}

// remove takes w off the list; it returns false if w was no longer on it
// (it has been woken).
func (l *waitList) remove(w *qwaiter) bool {
	if !w.queued {
		return false
	}
	if w.prev == nil {
		l.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		l.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
	return true
}

func (l *waitList) wakeOne() {
	if w := l.head; w != nil {
		l.remove(w)
		w.ready <- struct{}{}
	}
}

func (l *waitList) wakeAll() {
	for l.head != nil {
		l.wakeOne()
	}
}
