package middleware

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
)

// Lane is one lane of a [VertexBudget] split by [WithLanes]: a class of work
// with its own FIFO queue, a weight and an optional reserved share.
//
// A message goes to the first lane that selects it: every selector the lane
// sets (Handlers, Topics, MaxCharge) must match, and a lane that sets none
// takes everything. A message no lane selects goes to the last lane.
//
// Across lanes, admission is work-conserving weighted fair queuing in
// vertices. While no lane waits, any lane takes what is free, so an idle
// lane's share is borrowed by the busy ones. When budget frees and lanes
// wait, the lane that has been served least for its weight goes first;
// while its head does not fit yet, the budget is held for it and the other
// lanes take only their own unused reservation, so the head is admitted as
// soon as the work admitted before it has drained. A waiter at the head of
// lane i is therefore picked after the other lanes have been admitted at
// most Σ_{j≠i} (w_j·S + C_j) vertices, where C_k is the largest charge
// lane k admits (at most the capacity), w_k its weight and S the largest
// C_k/w_k; with two lanes of equal weight, at most one capacity plus one
// charge of the other lane.
//
// A reservation is always available to its lane: the other lanes never
// take it, even borrowing, so a lane within its reservation is admitted at
// once, whatever waits in the other lanes (unless a shrink left the budget
// above its new capacity). A charge is clamped to its lane's ceiling, the
// capacity less the other lanes' reservations.
type Lane struct {
	// Name identifies the lane in stats, metrics and errors. Required,
	// unique.
	Name string `yaml:"name"`
	// Weight is the lane's share of the budget when lanes compete,
	// relative to the other lanes' weights. Default 1.
	Weight int64 `yaml:"weight"`
	// Reserve is the share of the capacity, from 0 to below 1, kept for
	// this lane alone; it follows Resize. The reservations together must
	// be below 1. Default 0: nothing reserved.
	Reserve float64 `yaml:"reserve"`
	// Handlers selects messages of these Watermill handlers (the handler
	// name in the message context). Empty: any handler.
	Handlers []string `yaml:"handlers"`
	// Topics selects messages subscribed from these topics (the topic in
	// the message context). Empty: any topic.
	Topics []string `yaml:"topics"`
	// MaxCharge selects charges below it, in vertices: 1000 for "light:
	// charge < 1000". 0: any charge.
	MaxCharge int64 `yaml:"max_charge"`
}

// WithLanes, an option of [NewVertexBudget], splits the budget into lanes
// (see [Lane]), in selection order. No lanes, or one, is the plain FIFO
// budget. NewVertexBudget reports a [*spillway.FieldError] for a lane
// without a name, a repeated name, a negative weight or MaxCharge, a
// reserve outside [0, 1), reserves summing to 1 or more, or more than
// 65,536 lanes.
func WithLanes(lanes ...Lane) Option {
	return func(o *options) {
		o.forBudget = append(o.forBudget, "WithLanes")
		o.lanes = lanes
	}
}

// newLanes returns the lanes' state for the (valid) lanes of WithLanes: one
// lane, named "default", when there are none.
func newLanes(lanes []Lane) []lane {
	if len(lanes) == 0 {
		return []lane{{name: "default", weight: 1}}
	}
	out := make([]lane, len(lanes))
	for i, c := range lanes {
		w := c.Weight
		if w == 0 {
			w = 1
		}
		out[i] = lane{name: c.Name, weight: w, share: c.Reserve,
			handlers: slices.Clone(c.Handlers), topics: slices.Clone(c.Topics), maxCharge: c.MaxCharge}
	}
	return out
}

// maxLanes bounds the number of lanes; a [Permit] keeps its lane's index
// in a few bits.
const maxLanes = 1 << 16

// validateLanes reports the first invalid lane of a [WithLanes] list as a
// [*spillway.FieldError] whose field is lanes[i].key.
func validateLanes(lanes []Lane) error {
	if len(lanes) > maxLanes {
		return &spillway.FieldError{Field: "lanes", Value: strconv.Itoa(len(lanes)), Reason: "at most " + strconv.Itoa(maxLanes) + " lanes"}
	}
	var sum float64
	seen := make(map[string]bool, len(lanes))
	for i, c := range lanes {
		bad := func(key, value, reason string) error {
			return &spillway.FieldError{Field: "lanes[" + strconv.Itoa(i) + "]." + key, Value: value, Reason: reason}
		}
		switch {
		case c.Name == "":
			return bad("name", "", "required")
		case seen[c.Name]:
			return bad("name", c.Name, "repeats an earlier lane's name")
		case c.Weight < 0:
			return bad("weight", strconv.FormatInt(c.Weight, 10), "must be positive (0: the default, 1)")
		case c.Weight > 1<<20:
			return bad("weight", strconv.FormatInt(c.Weight, 10), "must be at most 1048576")
		case c.Reserve < 0 || c.Reserve >= 1 || math.IsNaN(c.Reserve):
			return bad("reserve", strconv.FormatFloat(c.Reserve, 'g', -1, 64), "must be a share of the capacity, at least 0 and below 1")
		case c.MaxCharge < 0:
			return bad("max_charge", strconv.FormatInt(c.MaxCharge, 10), "must be zero (any charge) or positive")
		}
		seen[c.Name] = true
		sum += c.Reserve
		if sum >= 1 {
			return bad("reserve", strconv.FormatFloat(c.Reserve, 'g', -1, 64),
				fmt.Sprintf("the lanes' reserves add up to %g; they must stay below 1", sum))
		}
	}
	return nil
}

// lane is a lane's state, guarded by the budget's lock but for
// saturatedSince.
type lane struct {
	// What the uncontended path reads and writes comes first, on one
	// cache line.
	reserve       int64 // share × capacity, in vertices
	ceil          int64 // the capacity less the other lanes' reserves
	inUse         int64
	admitted      uint64
	admittedVerts uint64

	name      string
	weight    int64
	share     float64 // reserved share of the capacity
	handlers  []string
	topics    []string
	maxCharge int64

	head, tail   *waiter
	waiting      int
	waitingVerts int64
	// served is the lane's virtual service: vertices admitted while
	// some lane waited, over the weight. The waiting lane with the
	// least goes first.
	served float64

	peakInUse int64
	clamped   uint64
	totalWait time.Duration

	saturatedSince atomic.Int64 // as VertexBudget.saturatedSince
}

// laneFor returns the index of the lane for a message of handler and topic
// charged vertices.
func (b *VertexBudget) laneFor(handler, topic string, vertices int64) int {
	last := len(b.lanes) - 1
	for i := range last {
		l := &b.lanes[i]
		if (len(l.handlers) == 0 || slices.Contains(l.handlers, handler)) &&
			(len(l.topics) == 0 || slices.Contains(l.topics, topic)) &&
			(l.maxCharge == 0 || vertices < l.maxCharge) {
			return i
		}
	}
	return last
}

// selectsByMessage reports whether some lane selects by handler or topic,
// so the middleware must read them from the message context.
func (b *VertexBudget) selectsByMessage() bool {
	for i := range b.lanes {
		if len(b.lanes[i].handlers) > 0 || len(b.lanes[i].topics) > 0 {
			return true
		}
	}
	return false
}

// setReservesLocked turns the lanes' shares into vertices of the current
// capacity and recomputes the idle reservation.
func (b *VertexBudget) setReservesLocked() {
	b.reserved, b.idleReserve = 0, 0
	for i := range b.lanes {
		l := &b.lanes[i]
		l.reserve = 0
		if len(b.lanes) > 1 {
			l.reserve = int64(l.share * float64(b.capacity))
		}
		b.reserved += l.reserve
		b.idleReserve += max(0, l.reserve-l.inUse)
	}
	for i := range b.lanes {
		l := &b.lanes[i]
		l.ceil = b.capacity - (b.reserved - l.reserve)
	}
}

// backlogLocked is called before a waiter joins lane l. A lane that starts
// waiting gets no credit for having been idle: its virtual service is
// raised to the least of the lanes already waiting. When no lane was
// waiting, a new round of fair queuing starts from zero.
func (b *VertexBudget) backlogLocked(l *lane) {
	if l.head != nil {
		return
	}
	if b.waiting == 0 {
		for i := range b.lanes {
			b.lanes[i].served = 0
		}
		return
	}
	least := math.Inf(1)
	for i := range b.lanes {
		if o := &b.lanes[i]; o != l && o.head != nil && o.served < least {
			least = o.served
		}
	}
	l.served = max(l.served, least)
}

// dispatchLocked admits waiters across lanes by weighted fair queuing: the
// waiting lane served least for its weight (the earlier head on a tie) goes
// first while its head fits. Once it does not fit, the budget is held for
// it: the other lanes take only their own unused reservation.
func (b *VertexBudget) dispatchLocked() {
	var now time.Duration
	for b.waiting != 0 {
		var pick *lane
		for i := range b.lanes {
			l := &b.lanes[i]
			if l.head != nil && (pick == nil || l.served < pick.served ||
				(l.served == pick.served && l.head.enqueued < pick.head.enqueued)) {
				pick = l
			}
		}
		w := pick.head
		v, m, clamped, ok := b.fits(pick, w.vertices, w.messages)
		if now == 0 {
			now = time.Since(b.epoch)
		}
		if ok {
			b.grantLocked(pick, w, v, m, clamped, now)
			continue
		}
		for i := range b.lanes {
			l := &b.lanes[i]
			if l == pick {
				continue
			}
			for w := l.head; w != nil; w = l.head {
				v, m, clamped, ok := b.fits(l, w.vertices, w.messages)
				if !ok || l.inUse+v > l.reserve {
					break
				}
				b.grantLocked(l, w, v, m, clamped, now)
			}
		}
		return
	}
}

// laneSaturatedLocked reports whether lane l's next charge would have to
// wait: it has waiters, its room (the capacity less what is in use and the
// other lanes' unused reservations) or the message limit is used up, or
// another lane waits and l's own reservation is in use.
func (b *VertexBudget) laneSaturatedLocked(l *lane) bool {
	return l.head != nil ||
		b.capacity-b.inUse-(b.idleReserve-max(0, l.reserve-l.inUse)) <= 0 ||
		(b.messageLimit > 0 && b.inUseMsgs >= b.messageLimit) ||
		(b.waiting != 0 && l.inUse >= l.reserve)
}

// updateLaneSaturationLocked sets or clears each lane's saturatedSince;
// now is the instant to record, 0 to read the clock when needed.
func (b *VertexBudget) updateLaneSaturationLocked(now int64) {
	some := false
	for i := range b.lanes {
		l := &b.lanes[i]
		sat := b.laneSaturatedLocked(l)
		was := l.saturatedSince.Load() != 0
		switch {
		case sat && !was:
			if now == 0 {
				now = int64(time.Since(b.epoch)) + 1
			}
			l.saturatedSince.Store(now)
		case !sat && was:
			l.saturatedSince.Store(0)
		}
		some = some || sat
	}
	b.laneSat = some
}

// oldestLocked returns the waiter that has waited longest, or nil.
func (b *VertexBudget) oldestLocked() *waiter {
	var o *waiter
	for i := range b.lanes {
		if w := b.lanes[i].head; w != nil && (o == nil || w.enqueued < o.enqueued) {
			o = w
		}
	}
	return o
}

func (b *VertexBudget) saturatedFor(since int64) time.Duration {
	if since == 0 {
		return 0
	}
	d := time.Since(b.epoch) - time.Duration(since-1)
	if d <= 0 {
		return 1 // saturated, but for less than the clock resolves
	}
	return d
}

// Lanes returns a snapshot of each lane, in [WithLanes] order, with Name
// set. A budget without lanes has one, named "default", whose figures are
// the budget's.
func (b *VertexBudget) Lanes() []BudgetStats {
	b.mu.Lock()
	out := make([]BudgetStats, len(b.lanes))
	var now time.Duration
	for i := range b.lanes {
		l := &b.lanes[i]
		out[i] = BudgetStats{Name: l.name, Capacity: l.ceil, InUse: l.inUse, PeakInUse: l.peakInUse,
			Waiting: l.waiting, WaitingVertices: l.waitingVerts, Admitted: l.admitted, AdmittedVertices: l.admittedVerts,
			Clamped: l.clamped, TotalWait: l.totalWait}
		if l.head != nil {
			if now == 0 {
				now = time.Since(b.epoch)
			}
			out[i].OldestWait = now - l.head.enqueued
		}
	}
	if b.single {
		s := &out[0]
		s.Capacity, s.InUse, s.PeakInUse = b.capacity, b.inUse, b.peakInUse
		s.Admitted, s.AdmittedVertices, s.Clamped, s.TotalWait = b.admitted, b.admittedVerts, b.clamped, b.totalWait
	}
	b.mu.Unlock()
	for i := range out {
		if len(b.lanes) == 1 {
			out[i].SaturatedFor = b.SaturatedFor()
		} else {
			out[i].SaturatedFor = b.saturatedFor(b.lanes[i].saturatedSince.Load())
		}
	}
	return out
}
