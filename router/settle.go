package router

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// settling follows each message from the moment it enters the stack until
// Watermill has acked or nacked it. Watermill publishes a handler's produced
// messages and acks (or nacks) the delivered one only after every
// middleware has returned, so a message whose work is done is still
// unsettled for a while; if the subscriber closed in that window, its ack
// would be lost and the broker would redeliver finished work. Close waits
// for settling before it closes anything.
//
// Messages held at the shutdown gate (they arrived after Close started and
// wait there, unprocessed, until their subscriber closes) are counted apart:
// Close must not wait for them.
//
// The messages that left are kept in shards picked by the message's
// address: every message goroutine passes through leave, and one list
// under one mutex made them queue for it (the mutex profile's largest
// item of the router's own on the Kafka benchmark).
type settling struct {
	held atomic.Int64 // messages held at the shutdown gate

	shards [settleShards]settleShard
}

const settleShards = 16

// settleShard is one share of the messages in the stack and of those that
// left it. The counts are kept per shard, beside the shard's lock, not in
// counters of the router's: every message goroutine changes them twice,
// and a counter all of them share moved between the cores on nearly every
// change (the Kafka benchmark's profile: 0.2 µs a message for the
// settling layer's two).
type settleShard struct {
	mu    sync.Mutex
	left  []settleEntry // left the stack, maybe not settled yet
	limit int           // prune left when it reaches this length

	inside  atomic.Int64 // in the stack (held ones too); lowered under mu
	running atomic.Int64 // of those, admitted and in their handler (Router.handOver)

	_ [8]byte // 64 bytes: one shard per cache line
}

// settleEntry is what the settling layer keeps of a message that left the
// stack: its ack and nack signals, not the message. A settled message
// waits in its shard until the next prune, and keeping the message would
// keep its payload (a heavy geometry) alive beyond what the vertex budget
// admits.
type settleEntry struct {
	acked, nacked <-chan struct{}
}

// pick picks a shard at random: a delivery keeps the shard it was given,
// and only the sums over the shards are read, so any spread will do.
func (s *settling) pick() *settleShard {
	return &s.shards[rand.Uint64()%settleShards]
}

// layer is the outermost middleware: it counts the message inside and, on
// the way out, keeps it until it is settled.
func (s *settling) layer(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		sh := s.pick()
		setSlotted(msg, sh)
		sh.inside.Add(1)
		defer sh.leave(msg)
		return h(msg)
	}
}

// slotted is a message's context from the settling layer down: the
// context Watermill gave it, with the delivery context the budget slot
// uses for the message's first attempt allocated alongside, so that the
// two cost one allocation.
type slotted struct {
	context.Context
	d    delivery
	used bool // d was handed out: later attempts (the retry gate's) allocate
}

// slottedKey finds the slotted context below the contexts the layers
// between the settling layer and the slot made.
type slottedKey struct{}

// Value returns c for slottedKey and asks the parent otherwise.
func (c *slotted) Value(key any) any {
	if _, ok := key.(slottedKey); ok {
		return c
	}
	return c.Context.Value(key)
}

// setSlotted gives msg its slotted context.
func setSlotted(msg *message.Message, sh *settleShard) {
	c := &slotted{Context: msg.Context()}
	c.d.shard = sh
	msg.SetContext(c)
}

// newDelivery returns the delivery context for a message whose context, as
// it reaches the slot, is ctx: the one the settling layer allocated for
// it, on the first attempt, or a new one.
func newDelivery(ctx context.Context) *delivery {
	c, ok := ctx.(*slotted)
	if !ok {
		c, _ = ctx.Value(slottedKey{}).(*slotted)
	}
	if c == nil || c.used {
		return new(delivery)
	}
	c.used = true
	return &c.d
}

// leave keeps msg, which leaves the stack, until it is settled.
func (sh *settleShard) leave(msg *message.Message) {
	sh.mu.Lock()
	if len(sh.left) >= sh.limit {
		sh.pruneLocked()
		// Doubling keeps the pruning's cost constant per message however
		// many messages are unsettled at once.
		sh.limit = max(16, 2*len(sh.left))
	}
	sh.left = append(sh.left, settleEntry{acked: msg.Acked(), nacked: msg.Nacked()})
	// Under mu, with the append: wait sees msg either inside or left,
	// never in neither.
	sh.inside.Add(-1)
	sh.mu.Unlock()
}

// settled reports whether Watermill has acked or nacked the message. Two
// selects of one case each: the compiler makes each a non-blocking receive
// that reads an open, empty channel without locking it, where one select
// of both would lock both channels.
func (e settleEntry) settled() bool {
	select {
	case <-e.acked:
		return true
	default:
	}
	select {
	case <-e.nacked:
		return true
	default:
		return false
	}
}

func (s *settleShard) pruneLocked() {
	keep := s.left[:0]
	for _, e := range s.left {
		if !e.settled() {
			keep = append(keep, e)
		}
	}
	clear(s.left[len(keep):])
	s.left = keep
}

// wait blocks until every message that entered the stack, except those
// held at the shutdown gate, has left it and been acked or nacked, or
// until deadline. It returns how many were still unsettled and, of those,
// how many were still in their handler.
func (s *settling) wait(deadline time.Time) (unsettled, running int64) {
	for {
		unsettled, running = s.count()
		if unsettled <= 0 {
			return 0, 0
		}
		if time.Now().After(deadline) {
			return unsettled, running
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// count returns how many messages are in the stack or unsettled, not
// counting those held at the shutdown gate, and how many are in their
// handler.
func (s *settling) count() (unsettled, running int64) {
	// held first: a message held after this is still inside its shard
	// and counted there, so one held during the scan is counted once
	// too many, never once too few.
	n := -s.held.Load()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.pruneLocked()
		n += sh.inside.Load() + int64(len(sh.left))
		sh.mu.Unlock()
		running += sh.running.Load()
	}
	return n, running
}
