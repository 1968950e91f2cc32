package middleware

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
)

// errNegativeCost is returned when a charge has a negative dimension.
var errNegativeCost = errors.New("spillway: negative cost")

// maxCapacity is the largest capacity a [VertexBudget] accepts, in
// vertices: 2⁴⁰, about 1.1 × 10¹² vertices, far beyond what any process
// can hold in memory. Bounding it keeps the budget's arithmetic (in use
// plus a charge, the sum of the waiting charges) clear of int64 overflow.
const maxCapacity int64 = 1 << 40

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
// With [WithLanes] the budget is split into lanes: FIFO within each lane,
// weighted fair queuing in vertices across them, and an optional reserved
// share per lane (see [Lane]). Without it there is one lane and the
// behaviour above is exact.
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
	waiting      int
	waitingVerts int64

	// lanes has at least one lane; one lane is the plain FIFO budget.
	lanes []lane
	// reserved is the sum of the lanes' reservations, idleReserve the
	// part of it not in use (the sum of max(0, reserve − inUse) per
	// lane). Both are 0 without reservations.
	reserved    int64
	idleReserve int64
	laneSat     bool // some lane's saturatedSince is set (multi-lane only)
	single      bool // one lane: lanes[0]'s inUse is inUse and is not kept

	admittedVerts uint64 // one lane only: vertices admitted

	// byCharge lists, in order, the lanes a charge without a message can
	// select (no handler or topic selector), with their MaxCharge.
	byCharge []chargeSel
	// firstBelow and firstLane are byCharge's first selector, read
	// without the loop: charges below firstBelow go to lane firstLane
	// (MaxInt64 for a selector without MaxCharge, MinInt64 without any).
	firstBelow int64
	firstLane  int

	waiters sync.Pool // recycled *waiter of this budget, with their channels

	admitted  uint64 // one lane only: the lanes count their own
	clamped   uint64
	cancelled uint64
	peakInUse int64
	totalWait time.Duration // summed over the admitted charges that waited
}

// NewVertexBudget returns a budget of capacity vertices, configured by the
// options that belong to it ([WithLanes], [WithMessageLimit]). It returns
// [*spillway.FieldError]s (matching [spillway.ErrInvalidConfig]), joined,
// if capacity is not positive (a budget is sized from measurements, see
// package sizing, and a zero budget is always a mistake) or above 2⁴⁰
// vertices (far beyond what a process can hold in memory), if the lanes
// are invalid, or for an option of [New].
func NewVertexBudget(capacity int64, opts ...Option) (*VertexBudget, error) {
	o := collect(opts)
	var errs []error
	if err := checkCapacity(capacity); err != nil {
		errs = append(errs, err)
	}
	if err := validateLanes(o.lanes); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, misplaced(o.forNew, "New", "NewVertexBudget")...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	b := &VertexBudget{epoch: time.Now(), capacity: capacity, messageLimit: o.messageLimit}
	b.lanes = newLanes(o.lanes)
	b.single = len(b.lanes) == 1
	for i := range b.lanes {
		if l := &b.lanes[i]; len(l.handlers) == 0 && len(l.topics) == 0 {
			b.byCharge = append(b.byCharge, chargeSel{lane: int32(i), max: l.maxCharge})
		}
	}
	b.firstBelow = math.MinInt64
	if len(b.byCharge) > 0 {
		c := b.byCharge[0]
		b.firstBelow, b.firstLane = c.max, int(c.lane)
		if c.max == 0 {
			b.firstBelow = math.MaxInt64
		}
	}
	b.setReservesLocked()
	return b, nil
}

// checkCapacity reports a capacity outside [1, maxCapacity].
func checkCapacity(capacity int64) error {
	switch {
	case capacity <= 0:
		return &spillway.FieldError{Field: "capacity", Value: strconv.FormatInt(capacity, 10), Reason: "must be positive"}
	case capacity > maxCapacity:
		return &spillway.FieldError{Field: "capacity", Value: strconv.FormatInt(capacity, 10),
			Reason: "must be at most " + strconv.FormatInt(maxCapacity, 10)}
	}
	return nil
}

// Permit is an admitted charge. Release it exactly once, when the work it
// stands for is done. The zero Permit holds nothing and releasing it is a
// no-op.
type Permit struct {
	// Four words at most, so that the compiler keeps a Permit in
	// registers: a larger struct is copied through memory on every
	// return and call, which cost the uncontended acquire and release
	// about 10 ns (store-forwarding stalls on the copies).
	b *VertexBudget
	// held packs the granted vertices (at most maxCapacity, 41 bits),
	// the lane's index above them and, in the top bit, whether the
	// charge was clamped.
	held     uint64
	messages int64
	wait     time.Duration // how long the charge waited
}

const (
	heldVertices = 1<<41 - 1 // maxCapacity fits
	heldLaneAt   = 41
	heldLanes    = 1<<22 - 1 // lane indexes (WithLanes allows far fewer)
	heldClamped  = 1 << 63
)

// permit returns the permit of b for v vertices and m messages granted in
// lane li.
func (b *VertexBudget) permit(v, m int64, li int, clamped bool, wait time.Duration) Permit {
	h := uint64(v) | uint64(li)<<heldLaneAt
	if clamped {
		h |= heldClamped
	}
	return Permit{b: b, held: h, messages: m, wait: wait}
}

// vertices returns the vertices p holds.
func (p Permit) vertices() int64 { return int64(p.held & heldVertices) }

// lane returns the index of p's lane.
func (p Permit) lane() int { return int(p.held >> heldLaneAt & heldLanes) }

// clamped reports whether p's charge was clamped to its lane's ceiling.
func (p Permit) clamped() bool { return p.held&heldClamped != 0 }

// Release returns the permit's charge to its budget and admits waiters that
// now fit, in FIFO order. Releasing a permit twice corrupts the accounting;
// Release panics if the budget would go negative.
func (p Permit) Release() {
	if p.b != nil {
		p.b.release(p)
	}
}

type chargeSel struct {
	lane int32
	max  int64
}

type waiter struct {
	vertices, messages int64 // as requested
	lane               int32
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

// newWaiter returns a recycled waiter of this budget, or a new one.
// Waiters and their channels are reused only within one budget (its own
// pool): a channel made inside a testing/synctest bubble must not be used
// by another, and a budget lives in one bubble.
func (b *VertexBudget) newWaiter() *waiter {
	if w, ok := b.waiters.Get().(*waiter); ok {
		return w
	}
	return &waiter{ready: make(chan struct{}, 1)}
}

// recycle returns w, whose channel is empty, to the budget's pool.
func (b *VertexBudget) recycle(w *waiter) {
	*w = waiter{ready: w.ready}
	b.waiters.Put(w)
}

// Acquire charges vertices (and one message) against the budget, blocking in
// FIFO order until it fits or ctx is done. On cancellation it returns
// ctx.Err() unchanged and holds nothing. A cost above the capacity is clamped
// to the capacity. With lanes, the charge goes to the first lane whose
// [Lane.MaxCharge] admits it and that selects no handler or topic, or else
// to the last lane.
func (b *VertexBudget) Acquire(ctx context.Context, vertices int64) (Permit, error) {
	if b.single {
		if p, ok := b.admitNow(vertices, 1); ok {
			return p, nil
		}
		return b.acquire(ctx, 0, vertices, 1, nil)
	}
	li := b.chargeLane(vertices)
	if p, ok := b.admitLaneNow(li, vertices, 1); ok {
		return p, nil
	}
	return b.acquire(ctx, li, vertices, 1, nil)
}

// admitNow is the uncontended path of Acquire and of the middleware: with
// nobody waiting and no message limit, a charge that fits unclamped is
// taken under one lock with a few comparisons and sums, and nothing else.
// It reports false, holding nothing, when the general path must decide.
// This one is for the budget without lanes, admitLaneNow for lanes.
func (b *VertexBudget) admitNow(vertices, messages int64) (Permit, bool) {
	b.mu.Lock()
	if b.waiting != 0 || b.messageLimit != 0 || vertices < 0 || messages < 0 || vertices > b.capacity-b.inUse {
		b.mu.Unlock()
		return Permit{}, false
	}
	b.inUse += vertices
	b.inUseMsgs += messages
	b.admitted++
	b.admittedVerts += uint64(vertices)
	if b.inUse > b.peakInUse {
		b.peakInUse = b.inUse
	}
	if b.inUse >= b.capacity {
		b.updateSaturationLocked()
	}
	b.mu.Unlock()
	return Permit{b: b, held: uint64(vertices), messages: messages}, true
}

// admitLaneNow is admitNow in lane li of a budget with lanes: the charge
// must fit, unclamped, in the shared room (what is neither in use nor
// reserved and idle) plus the lane's own idle reservation, which it uses
// first.
func (b *VertexBudget) admitLaneNow(li int, vertices, messages int64) (Permit, bool) {
	// The lanes slice never changes after NewVertexBudget: the lane is
	// found before the lock, off the critical section's path.
	l := &b.lanes[li]
	b.mu.Lock()
	if b.waiting != 0 || b.messageLimit != 0 || vertices < 0 || messages < 0 {
		b.mu.Unlock()
		return Permit{}, false
	}
	// The sums are made in locals and stored once: reading back a field
	// just written stalls on store forwarding.
	laneInUse := l.inUse
	own := max(0, l.reserve-laneInUse)
	inUse, idle := b.inUse, b.idleReserve
	if vertices > l.ceil || vertices > b.capacity-inUse-idle+own {
		b.mu.Unlock()
		return Permit{}, false
	}
	inUse += vertices
	idle -= min(own, vertices)
	laneInUse += vertices
	b.inUse, b.idleReserve, l.inUse = inUse, idle, laneInUse
	b.inUseMsgs += messages
	if inUse > b.peakInUse {
		b.peakInUse = inUse
	}
	if laneInUse > l.peakInUse {
		l.peakInUse = laneInUse
	}
	l.admitted++
	l.admittedVerts += uint64(vertices)
	if b.capacity-inUse-idle <= 0 {
		// No shared room left: the budget, or the lanes without idle
		// reservation, are saturated.
		b.updateSaturationLocked()
	}
	b.mu.Unlock()
	return b.permit(vertices, messages, li, false, 0), true
}

// acquire charges vertices and messages in lane li: at once if nobody
// waits and the charge fits, else in waitLocked.
func (b *VertexBudget) acquire(ctx context.Context, li int, vertices, messages int64, abort <-chan struct{}) (Permit, error) {
	if vertices < 0 || messages < 0 {
		return Permit{}, errNegativeCost
	}
	l := &b.lanes[li]
	b.mu.Lock()
	if b.waiting == 0 {
		if v, m, clamped, ok := b.fits(l, vertices, messages); ok {
			b.take(l, v, m, clamped)
			// Taking only adds load, so saturation can only have begun:
			// the whole budget's, or a lane's once no lane has room.
			if b.saturatedLocked() || (b.reserved != 0 && b.capacity-b.inUse-b.idleReserve <= 0) {
				b.updateSaturationLocked()
			}
			b.mu.Unlock()
			return b.permit(v, m, li, clamped, 0), nil
		}
	}
	return b.waitLocked(ctx, li, vertices, messages, abort)
}

// chargeLane is laneFor for a charge without a message: the first lane
// that selects no handler or topic and whose MaxCharge admits vertices, or
// the last lane.
func (b *VertexBudget) chargeLane(vertices int64) int {
	if vertices < b.firstBelow {
		return b.firstLane
	}
	return b.chargeLaneAfter(vertices)
}

// chargeLaneAfter is chargeLane past the first selector: the loop, kept
// out of the inlined part.
func (b *VertexBudget) chargeLaneAfter(vertices int64) int {
	for _, c := range b.byCharge {
		if c.max == 0 || vertices < c.max {
			return int(c.lane)
		}
	}
	return len(b.lanes) - 1
}

// tryAcquire admits the charge (in the lane Acquire would use) only if it
// fits now and nobody is waiting ahead of it. It never blocks.
func (b *VertexBudget) tryAcquire(vertices int64) (Permit, bool) {
	if vertices < 0 {
		return Permit{}, false
	}
	var li int
	if len(b.lanes) > 1 {
		li = b.chargeLane(vertices)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	l := &b.lanes[li]
	if b.waiting != 0 && (l.head != nil || len(b.lanes) == 1) {
		return Permit{}, false
	}
	v, m, clamped, ok := b.fits(l, vertices, 1)
	if !ok || (b.waiting != 0 && l.inUse+v > l.reserve) {
		// With other lanes waiting, only the lane's own reservation is
		// free to take without queuing.
		return Permit{}, false
	}
	b.take(l, v, m, clamped)
	b.updateSaturationLocked()
	return b.permit(v, m, li, clamped, 0), true
}

// waitLocked is acquire's slow path, entered with the lock held: the
// charge queues in its lane.
func (b *VertexBudget) waitLocked(ctx context.Context, li int, vertices, messages int64, abort <-chan struct{}) (Permit, error) {
	l := &b.lanes[li]
	if err := ctx.Err(); err != nil {
		b.mu.Unlock()
		return Permit{}, err
	}
	w := b.newWaiter()
	w.vertices, w.messages, w.lane = vertices, messages, int32(li)
	w.enqueued = time.Since(b.epoch)
	b.pushLocked(w)
	if len(b.lanes) > 1 && l.head == w {
		// A lane that starts waiting may be served at once: it may be
		// the lane below its share, or within its reservation.
		b.notifyLocked()
		if w.granted {
			// Admitted without blocking: not a wait.
			<-w.ready
			b.totalWait -= w.gWait
			l.totalWait -= w.gWait
			p := b.permit(w.gVertices, w.gMessages, int(w.lane), w.gClamped, 0)
			b.updateSaturationLocked()
			b.recycle(w)
			b.mu.Unlock()
			return p, nil
		}
	}
	b.updateSaturationLocked()
	b.mu.Unlock()

	done := ctx.Done()
	if done == nil && abort == nil {
		// Nothing can end the wait but the grant: a plain receive, not a
		// select.
		<-w.ready
		p := b.permit(w.gVertices, w.gMessages, int(w.lane), w.gClamped, w.gWait)
		b.recycle(w)
		return p, nil
	}
	var err error
	select {
	case <-w.ready:
		p := b.permit(w.gVertices, w.gMessages, int(w.lane), w.gClamped, w.gWait)
		b.recycle(w)
		return p, nil
	case <-done:
		err = ctx.Err()
	case <-abort:
		err = errRevoked
	}

	b.mu.Lock()
	if w.granted {
		// The grant raced with cancellation. The caller has given up, so
		// hand the charge straight back.
		<-w.ready
		b.returnLocked(&b.lanes[w.lane], w.gVertices, w.gMessages)
	} else {
		wasHead := b.lanes[w.lane].head == w
		b.removeLocked(w)
		b.cancelled++
		if wasHead {
			b.notifyLocked()
		}
	}
	b.updateSaturationLocked()
	waited := time.Since(b.epoch) - w.enqueued
	b.recycle(w)
	b.mu.Unlock()
	// The permit holds nothing; it only reports how long the wait lasted.
	return Permit{wait: waited}, err
}

// release returns p's charge and admits waiters that now fit, in FIFO order.
// Releasing a permit twice, or one from another budget, corrupts the
// accounting; release panics if the budget would go negative.
func (b *VertexBudget) release(p Permit) {
	if p.b != b {
		if p.b == nil {
			return
		}
		panic("spillway: Release of a permit from another VertexBudget")
	}
	v := p.vertices()
	l := &b.lanes[p.lane()] // fixed since NewVertexBudget: found before the lock
	b.mu.Lock()
	if b.single && b.waiting == 0 && b.saturatedSince.Load() == 0 && v <= b.inUse && p.messages <= b.inUseMsgs {
		// The plain budget with nobody waiting and no saturation to end.
		b.inUse -= v
		b.inUseMsgs -= p.messages
		b.mu.Unlock()
		return
	}
	if b.waiting == 0 && !b.laneSat && v <= l.inUse && p.messages <= b.inUseMsgs {
		// Lanes, nobody waiting and no saturation to end (the budget's
		// saturation implies a lane's: laneSat covers both). The lane's
		// reservation is refilled first.
		laneInUse := l.inUse - v
		b.inUse -= v
		b.inUseMsgs -= p.messages
		l.inUse = laneInUse
		b.idleReserve += min(v, max(0, l.reserve-laneInUse))
		b.mu.Unlock()
		return
	}
	b.returnLocked(l, v, p.messages)
	// Returning only removes load: saturation can only have ended, and
	// only if it had begun.
	if b.laneSat || b.saturatedSince.Load() != 0 {
		b.updateSaturationLocked()
	}
	b.mu.Unlock()
}

func (b *VertexBudget) returnLocked(l *lane, vertices, messages int64) {
	b.inUse -= vertices
	b.inUseMsgs -= messages
	if !b.single {
		before := max(0, l.reserve-l.inUse)
		l.inUse -= vertices
		b.idleReserve += max(0, l.reserve-l.inUse) - before
	}
	if b.inUse < 0 || b.inUseMsgs < 0 || l.inUse < 0 {
		b.mu.Unlock()
		panic("spillway: VertexBudget released more than was acquired")
	}
	if b.waiting != 0 {
		b.notifyLocked()
	}
}

// fits reports whether a charge of lane l can be admitted now, and what it
// is after clamping to the lane's ceiling (the capacity less the other
// lanes' reservations) and the message limit.
func (b *VertexBudget) fits(l *lane, vertices, messages int64) (v, m int64, clamped, ok bool) {
	v, m = vertices, messages
	if v > l.ceil {
		v, clamped = l.ceil, true
	}
	if b.messageLimit > 0 && m > b.messageLimit {
		m = b.messageLimit
	}
	// Compared as "more than what is left", never as a sum: neither side
	// can overflow, even after a shrink left inUse above the capacity.
	// What other lanes have reserved and do not use is not left.
	if v > 0 && v > b.capacity-b.inUse-(b.idleReserve-max(0, l.reserve-l.inUse)) {
		return v, m, clamped, false
	}
	if b.messageLimit > 0 && m > 0 && m > b.messageLimit-b.inUseMsgs {
		return v, m, clamped, false
	}
	return v, m, clamped, true
}

func (b *VertexBudget) take(l *lane, v, m int64, clamped bool) {
	b.inUse += v
	b.inUseMsgs += m
	if clamped {
		b.clamped++
	}
	if b.inUse > b.peakInUse {
		b.peakInUse = b.inUse
	}
	if len(b.lanes) > 1 {
		before := max(0, l.reserve-l.inUse)
		l.inUse += v
		b.idleReserve -= before - max(0, l.reserve-l.inUse)
		l.peakInUse = max(l.peakInUse, l.inUse)
		l.admitted++
		l.admittedVerts += uint64(v)
		if clamped {
			l.clamped++
		}
		if b.waiting != 0 {
			// Service counts towards the fair share only while some lane
			// is waiting.
			l.served += float64(v) / float64(l.weight)
		}
	} else {
		b.admitted++
		b.admittedVerts += uint64(v)
	}
}

// grantLocked admits w, the head of lane l, which fits as v, m.
func (b *VertexBudget) grantLocked(l *lane, w *waiter, v, m int64, clamped bool, now time.Duration) {
	b.take(l, v, m, clamped)
	b.removeLocked(w)
	wait := now - w.enqueued
	b.totalWait += wait
	if len(b.lanes) > 1 {
		l.totalWait += wait
	}
	w.granted, w.gVertices, w.gMessages, w.gClamped, w.gWait = true, v, m, clamped, wait
	w.ready <- struct{}{}
}

// notifyLocked admits waiters that now fit: from the head of the queue
// while they fit with one lane, by weighted fair queuing across lanes
// otherwise (lanes.go).
func (b *VertexBudget) notifyLocked() {
	if len(b.lanes) > 1 {
		b.dispatchLocked()
		return
	}
	var now time.Duration
	l := &b.lanes[0]
	for w := l.head; w != nil; w = l.head {
		v, m, clamped, ok := b.fits(l, w.vertices, w.messages)
		if !ok {
			return
		}
		if now == 0 {
			now = time.Since(b.epoch)
		}
		b.grantLocked(l, w, v, m, clamped, now)
	}
}

func (b *VertexBudget) pushLocked(w *waiter) {
	l := &b.lanes[w.lane]
	if len(b.lanes) > 1 {
		b.backlogLocked(l)
	}
	w.prev, w.next = l.tail, nil
	if l.tail == nil {
		l.head = w
	} else {
		l.tail.next = w
	}
	l.tail = w
	b.waiting++
	l.waiting++
	wv := min(w.vertices, b.capacity)
	b.waitingVerts += wv
	l.waitingVerts += wv
}

func (b *VertexBudget) removeLocked(w *waiter) {
	l := &b.lanes[w.lane]
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
	w.prev, w.next = nil, nil
	b.waiting--
	l.waiting--
	wv := min(w.vertices, b.capacity)
	b.waitingVerts -= wv
	l.waitingVerts -= wv
	if l.waiting == 0 {
		l.waitingVerts = 0 // capacity may have changed since the push
	}
	if b.waiting == 0 {
		b.waitingVerts = 0
	}
}

func (b *VertexBudget) saturatedLocked() bool {
	return b.waiting != 0 || b.inUse >= b.capacity ||
		(b.messageLimit > 0 && b.inUseMsgs >= b.messageLimit)
}

func (b *VertexBudget) updateSaturationLocked() {
	sat := b.saturatedLocked()
	was := b.saturatedSince.Load() != 0
	var now int64
	switch {
	case sat && !was:
		now = int64(time.Since(b.epoch)) + 1
		b.saturatedSince.Store(now)
	case !sat && was:
		b.saturatedSince.Store(0)
	}
	if len(b.lanes) > 1 {
		b.updateLaneSaturationLocked(now)
	}
}

// Resize changes the capacity. Growing admits waiters that now fit at once.
// Shrinking never revokes admitted work: new charges wait until enough of it
// has drained. It returns an error if capacity is not positive or above
// 2⁴⁰.
func (b *VertexBudget) Resize(capacity int64) error {
	if err := checkCapacity(capacity); err != nil {
		return fmt.Errorf("spillway: VertexBudget.Resize: %w", err)
	}
	b.mu.Lock()
	b.capacity = capacity
	// Waiting vertices are recorded clamped to the capacity at push time;
	// recompute so the figure stays exact.
	var wv int64
	for i := range b.lanes {
		l := &b.lanes[i]
		var lv int64
		for w := l.head; w != nil; w = w.next {
			lv += min(w.vertices, capacity)
		}
		l.waitingVerts = lv
		wv += lv
	}
	b.waitingVerts = wv
	// Reservations are shares of the capacity.
	b.setReservesLocked()
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

// BudgetStats is a point-in-time snapshot of a [VertexBudget]
// ([VertexBudget.Stats]) or of one of its lanes ([VertexBudget.Lanes]).
// The telemetry package exports it (spillway.budget.*). Its fill ratio is
// InUse / Capacity; how long admissions waited, one by one, is
// [Admission].Wait, and waits that were abandoned are the [Cancelled] and
// [Revoked] admissions.
type BudgetStats struct {
	// Name is the lane's name, "" for the whole budget.
	Name string
	// Capacity is the budget's capacity in vertices; for a lane, the most
	// it can hold: the capacity less the other lanes' reservations.
	Capacity  int64
	InUse     int64 // vertices admitted and not yet released
	PeakInUse int64 // highest InUse seen
	// Waiting is the number of callers blocked in Acquire (or in the
	// middleware).
	Waiting int
	// WaitingVertices is the sum of the waiters' charges, each clamped to
	// the capacity.
	WaitingVertices int64
	// OldestWait is how long the longest waiter has waited.
	OldestWait time.Duration
	// SaturatedFor is how long the next charge has had to wait without a
	// break (someone is waiting, or the vertices or the message limit are
	// used up), 0 if it would be admitted at once now.
	SaturatedFor     time.Duration
	Admitted         uint64        // permits granted, in total
	AdmittedVertices uint64        // their vertices, after clamping
	Clamped          uint64        // permits whose charge was clamped to the capacity (a lane's: to its Capacity)
	TotalWait        time.Duration // the time the admitted charges waited, summed
}

// Stats returns a snapshot of the whole budget. It takes the lock once and
// does not allocate.
func (b *VertexBudget) Stats() BudgetStats {
	b.mu.Lock()
	s := BudgetStats{
		Capacity:         b.capacity,
		InUse:            b.inUse,
		PeakInUse:        b.peakInUse,
		Waiting:          b.waiting,
		WaitingVertices:  b.waitingVerts,
		Admitted:         b.admitted, // one lane; the lanes' sums below
		AdmittedVertices: b.admittedVerts,
		Clamped:          b.clamped,
		TotalWait:        b.totalWait,
	}
	if !b.single {
		for i := range b.lanes {
			s.Admitted += b.lanes[i].admitted
			s.AdmittedVertices += b.lanes[i].admittedVerts
		}
	}
	if w := b.oldestLocked(); w != nil {
		s.OldestWait = time.Since(b.epoch) - w.enqueued
	}
	b.mu.Unlock()
	s.SaturatedFor = b.SaturatedFor()
	return s
}
