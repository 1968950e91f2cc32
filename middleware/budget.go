package middleware

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
)

// ErrNegativeCost is returned when a charge has a negative dimension.
var ErrNegativeCost = errors.New("spillway: negative cost")

// MaxCapacity is the largest capacity a [VertexBudget] accepts, in
// vertices: about 1.1 × 10¹² vertices, far beyond what any process can hold
// in memory. Bounding it keeps the budget's arithmetic (in use plus a
// charge, the sum of the waiting charges) clear of int64 overflow.
const MaxCapacity int64 = 1 << 40

// errRevoked is returned by acquire when the abort channel closes first.
var errRevoked = errors.New("spillway: delivery revoked while waiting for budget")

// VertexBudget bounds work in flight by its cost in vertices and, optionally,
// by a count of messages.
//
// Acquire blocks until the charge fits. Waiters are admitted strictly in
// arrival order (FIFO): a large waiter at the head is never overtaken, so a
// stream of small messages cannot starve it. A charge larger than the whole
// capacity is clamped to the capacity, so it is admitted once everything else
// has drained and then runs alone; nothing deadlocks on an oversized message.
//
// Every successful Acquire returns a [Permit] that must be released exactly
// once. A VertexBudget is safe for concurrent use by multiple goroutines. Its
// zero value is not usable; create one with [NewVertexBudget].
type VertexBudget struct {
	epoch time.Time // monotonic origin of every stored instant

	// saturatedSince is 0 when not saturated, else 1 + nanoseconds since
	// epoch at which saturation began. Read without the lock.
	saturatedSince atomic.Int64

	mu           sync.Mutex
	capacity     int64
	messageLimit int64 // 0: unlimited
	inUse        int64
	inUseMsgs    int64
	head, tail   *waiter
	waiting      int
	waitingVerts int64

	admitted  uint64
	clamped   uint64
	cancelled uint64
	peakInUse int64
	waited    uint64 // admissions that had to wait
	totalWait time.Duration
	maxWait   time.Duration
}

// Option configures a [VertexBudget].
type Option func(*VertexBudget)

// WithMessageLimit additionally bounds the number of admitted messages: at
// most n permits are outstanding at once, whatever their vertex cost. Use it
// for handlers with a fixed per-message price (a database round trip) on top
// of their geometry work. n <= 0 means no message limit.
func WithMessageLimit(n int64) Option {
	return func(b *VertexBudget) {
		if n > 0 {
			b.messageLimit = n
		}
	}
}

// NewVertexBudget returns a budget of capacity vertices. It returns a
// [*spillway.FieldError] (matching [spillway.ErrInvalidConfig]) if capacity
// is not positive (a budget is sized from measurements, see package
// sizing, and a zero budget is always a mistake) or above [MaxCapacity].
func NewVertexBudget(capacity int64, opts ...Option) (*VertexBudget, error) {
	if err := checkCapacity(capacity); err != nil {
		return nil, err
	}
	b := &VertexBudget{epoch: time.Now(), capacity: capacity}
	for _, o := range opts {
		o(b)
	}
	return b, nil
}

// checkCapacity reports a capacity outside [1, MaxCapacity].
func checkCapacity(capacity int64) error {
	switch {
	case capacity <= 0:
		return &spillway.FieldError{Field: "capacity", Value: strconv.FormatInt(capacity, 10), Reason: "must be positive"}
	case capacity > MaxCapacity:
		return &spillway.FieldError{Field: "capacity", Value: strconv.FormatInt(capacity, 10),
			Reason: "must be at most " + strconv.FormatInt(MaxCapacity, 10)}
	}
	return nil
}

// Permit is an admitted charge. Release it exactly once, when the work it
// stands for is done. The zero Permit holds nothing and releasing it is a
// no-op.
type Permit struct {
	b        *VertexBudget
	vertices int64
	messages int64
	wait     time.Duration
	clamped  bool
}

// Wait returns how long Acquire blocked before admitting the charge.
func (p Permit) Wait() time.Duration { return p.wait }

// Release returns the permit's charge to its budget and admits waiters that
// now fit, in FIFO order. Releasing a permit twice corrupts the accounting;
// Release panics if the budget would go negative.
func (p Permit) Release() {
	if p.b != nil {
		p.b.release(p)
	}
}

type waiter struct {
	vertices, messages int64 // as requested
	enqueued           time.Duration
	ready              chan struct{} // buffered(1); receives once on grant
	prev, next         *waiter

	// Set under the budget lock when granted.
	granted   bool
	gVertices int64
	gMessages int64
	gClamped  bool
	gWait     time.Duration
}

// Waiters are pooled, their channels are not: a channel made by one
// testing/synctest bubble cannot be used by another, and a waiting caller
// pays for its channel in time it spends blocked anyway.
var waiterPool = sync.Pool{New: func() any { return new(waiter) }}

// Acquire charges vertices (and one message) against the budget, blocking in
// FIFO order until it fits or ctx is done. On cancellation it returns
// ctx.Err() unchanged and holds nothing. A cost above the capacity is clamped
// to the capacity.
func (b *VertexBudget) Acquire(ctx context.Context, vertices int64) (Permit, error) {
	return b.acquire(ctx, vertices, 1, nil)
}

// tryAcquire admits the charge only if it fits now and nobody is waiting
// ahead of it. It never blocks.
func (b *VertexBudget) tryAcquire(vertices int64) (Permit, bool) {
	if vertices < 0 {
		return Permit{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.head != nil {
		return Permit{}, false
	}
	v, m, clamped, ok := b.fits(vertices, 1)
	if !ok {
		return Permit{}, false
	}
	b.take(v, m, clamped)
	b.updateSaturationLocked()
	return Permit{b: b, vertices: v, messages: m, clamped: clamped}, true
}

func (b *VertexBudget) acquire(ctx context.Context, vertices, messages int64, abort <-chan struct{}) (Permit, error) {
	if vertices < 0 || messages < 0 {
		return Permit{}, ErrNegativeCost
	}
	b.mu.Lock()
	if b.head == nil {
		if v, m, clamped, ok := b.fits(vertices, messages); ok {
			b.take(v, m, clamped)
			// Taking only adds load, so saturation can only have begun.
			if b.saturatedLocked() {
				b.updateSaturationLocked()
			}
			b.mu.Unlock()
			return Permit{b: b, vertices: v, messages: m, clamped: clamped}, nil
		}
	}
	if err := ctx.Err(); err != nil {
		b.mu.Unlock()
		return Permit{}, err
	}
	w := waiterPool.Get().(*waiter)
	w.vertices, w.messages = vertices, messages
	w.ready = make(chan struct{}, 1)
	w.enqueued = time.Since(b.epoch)
	b.pushLocked(w)
	b.updateSaturationLocked()
	b.mu.Unlock()

	var err error
	select {
	case <-w.ready:
		p := Permit{b: b, vertices: w.gVertices, messages: w.gMessages, wait: w.gWait, clamped: w.gClamped}
		b.recycle(w)
		return p, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-abort:
		err = errRevoked
	}

	b.mu.Lock()
	if w.granted {
		// The grant raced with cancellation. The caller has given up, so
		// hand the charge straight back.
		<-w.ready
		b.returnLocked(w.gVertices, w.gMessages)
	} else {
		wasHead := b.head == w
		b.removeLocked(w)
		b.cancelled++
		if wasHead {
			b.notifyLocked()
		}
	}
	b.updateSaturationLocked()
	waited := time.Since(b.epoch) - w.enqueued
	b.mu.Unlock()
	b.recycle(w)
	// The permit holds nothing; it only reports how long the wait lasted.
	return Permit{wait: waited}, err
}

func (b *VertexBudget) recycle(w *waiter) {
	*w = waiter{}
	waiterPool.Put(w)
}

// release returns p's charge and admits waiters that now fit, in FIFO order.
// Releasing a permit twice, or one from another budget, corrupts the
// accounting; release panics if the budget would go negative.
func (b *VertexBudget) release(p Permit) {
	if p.b == nil {
		return
	}
	if p.b != b {
		panic("spillway: Release of a permit from another VertexBudget")
	}
	b.mu.Lock()
	b.returnLocked(p.vertices, p.messages)
	b.updateSaturationLocked()
	b.mu.Unlock()
}

func (b *VertexBudget) returnLocked(vertices, messages int64) {
	b.inUse -= vertices
	b.inUseMsgs -= messages
	if b.inUse < 0 || b.inUseMsgs < 0 {
		b.mu.Unlock()
		panic("spillway: VertexBudget released more than was acquired")
	}
	b.notifyLocked()
}

// fits reports whether a charge can be admitted now, and what it is after
// clamping to the current capacity and message limit.
func (b *VertexBudget) fits(vertices, messages int64) (v, m int64, clamped, ok bool) {
	v, m = vertices, messages
	if v > b.capacity {
		v, clamped = b.capacity, true
	}
	if b.messageLimit > 0 && m > b.messageLimit {
		m = b.messageLimit
	}
	// Compared as "more than what is left", never as a sum: neither side
	// can overflow, even after a shrink left inUse above the capacity.
	if v > 0 && v > b.capacity-b.inUse {
		return v, m, clamped, false
	}
	if b.messageLimit > 0 && m > 0 && m > b.messageLimit-b.inUseMsgs {
		return v, m, clamped, false
	}
	return v, m, clamped, true
}

func (b *VertexBudget) take(v, m int64, clamped bool) {
	b.inUse += v
	b.inUseMsgs += m
	b.admitted++
	if clamped {
		b.clamped++
	}
	if b.inUse > b.peakInUse {
		b.peakInUse = b.inUse
	}
}

// notifyLocked admits waiters from the head of the queue while they fit.
func (b *VertexBudget) notifyLocked() {
	var now time.Duration
	for w := b.head; w != nil; w = b.head {
		v, m, clamped, ok := b.fits(w.vertices, w.messages)
		if !ok {
			return
		}
		if now == 0 {
			now = time.Since(b.epoch)
		}
		b.take(v, m, clamped)
		b.removeLocked(w)
		wait := now - w.enqueued
		b.waited++
		b.totalWait += wait
		if wait > b.maxWait {
			b.maxWait = wait
		}
		w.granted, w.gVertices, w.gMessages, w.gClamped, w.gWait = true, v, m, clamped, wait
		w.ready <- struct{}{}
	}
}

func (b *VertexBudget) pushLocked(w *waiter) {
	w.prev, w.next = b.tail, nil
	if b.tail == nil {
		b.head = w
	} else {
		b.tail.next = w
	}
	b.tail = w
	b.waiting++
	b.waitingVerts += min(w.vertices, b.capacity)
}

func (b *VertexBudget) removeLocked(w *waiter) {
	if w.prev == nil {
		b.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		b.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next = nil, nil
	b.waiting--
	b.waitingVerts -= min(w.vertices, b.capacity)
	if b.waiting == 0 {
		b.waitingVerts = 0 // capacity may have changed since the push
	}
}

func (b *VertexBudget) saturatedLocked() bool {
	return b.head != nil || b.inUse >= b.capacity ||
		(b.messageLimit > 0 && b.inUseMsgs >= b.messageLimit)
}

func (b *VertexBudget) updateSaturationLocked() {
	sat := b.saturatedLocked()
	was := b.saturatedSince.Load() != 0
	switch {
	case sat && !was:
		b.saturatedSince.Store(int64(time.Since(b.epoch)) + 1)
	case !sat && was:
		b.saturatedSince.Store(0)
	}
}

// Resize changes the capacity. Growing admits waiters that now fit at once.
// Shrinking never revokes admitted work: new charges wait until enough of it
// has drained. It returns an error if capacity is not positive or above
// [MaxCapacity].
func (b *VertexBudget) Resize(capacity int64) error {
	if err := checkCapacity(capacity); err != nil {
		return fmt.Errorf("spillway: VertexBudget.Resize: %w", err)
	}
	b.mu.Lock()
	b.capacity = capacity
	// Waiting vertices are recorded clamped to the capacity at push time;
	// recompute so the figure stays exact.
	var wv int64
	for w := b.head; w != nil; w = w.next {
		wv += min(w.vertices, capacity)
	}
	b.waitingVerts = wv
	b.notifyLocked()
	b.updateSaturationLocked()
	b.mu.Unlock()
	return nil
}

// Capacity returns the current capacity in vertices.
func (b *VertexBudget) Capacity() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.capacity
}

// SaturatedFor returns how long the budget has been saturated without a
// break, or 0 if it is not saturated now. Shedding and retry gating read it
// as the sustained-pressure signal. It does not take the budget's lock.
func (b *VertexBudget) SaturatedFor() time.Duration {
	s := b.saturatedSince.Load()
	if s == 0 {
		return 0
	}
	d := time.Since(b.epoch) - time.Duration(s-1)
	if d <= 0 {
		return 1 // saturated, but for less than the clock resolves
	}
	return d
}

// BudgetStats is a point-in-time snapshot of a [VertexBudget]. The
// telemetry package exports most of it (spillway.budget.*); how long the
// budget has been saturated is [VertexBudget.SaturatedFor], its fill ratio
// InUse / Capacity, and waits that were abandoned are the cancelled and
// revoked admissions ([Admission.Outcome]).
type BudgetStats struct {
	Capacity        int64         // vertices
	InUse           int64         // vertices admitted now
	Waiting         int           // callers blocked in Acquire
	WaitingVertices int64         // their vertices, clamped to the capacity
	OldestWait      time.Duration // how long the head waiter has waited
	// Saturated: the next charge cannot be admitted at once (someone is
	// waiting, or the vertices or the message limit are used up).
	Saturated bool
	PeakInUse int64         // highest InUse seen
	Admitted  uint64        // permits granted, in total
	Clamped   uint64        // of which clamped to the capacity
	Waited    uint64        // of which had to wait
	TotalWait time.Duration // summed over the admitted charges
	MaxWait   time.Duration // longest wait of any admitted charge
}

// Stats returns a snapshot. It takes the lock once and does not allocate.
func (b *VertexBudget) Stats() BudgetStats {
	b.mu.Lock()
	s := BudgetStats{
		Capacity:        b.capacity,
		InUse:           b.inUse,
		Waiting:         b.waiting,
		WaitingVertices: b.waitingVerts,
		PeakInUse:       b.peakInUse,
		Admitted:        b.admitted,
		Clamped:         b.clamped,
		Waited:          b.waited,
		TotalWait:       b.totalWait,
		MaxWait:         b.maxWait,
	}
	if b.head != nil {
		s.OldestWait = time.Since(b.epoch) - b.head.enqueued
	}
	b.mu.Unlock()
	s.Saturated = b.SaturatedFor() > 0
	return s
}
