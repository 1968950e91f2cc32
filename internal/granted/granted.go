// Package granted carries the charge a message was admitted with from the
// budget middleware (package middleware) to the layers that run inside it,
// such as the auto-sizer (package sizing), which must not import each
// other. Those layers then read the charge the budget granted, clamped to
// its capacity, instead of pricing the message a second time.
//
// The record lives for as long as the budget middleware runs the inner
// handler and is keyed by the message itself, so it survives layers that
// replace the message's context. It is made only once a reader has
// declared itself ([Want]): a process without an auto-sizer pays nothing
// for it.
package granted

import (
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
)

// Charge is what the budget admitted a message with.
type Charge struct {
	// Requested is the estimator's charge, before clamping.
	Requested int64
	// Vertices is what the budget holds for the message: Requested clamped
	// to the capacity.
	Vertices int64
	// Clamped says Requested was above the capacity.
	Clamped bool
	// Source is where Requested came from.
	Source cost.Source
}

// table maps a message being run by a budget middleware to its charge. It
// is sharded by the message's address, each shard a short list under its
// own mutex: only the messages in flight are in it, a handful per shard,
// so a scan of the list is cheaper than hashing into a map, and setting
// and removing an entry allocates nothing once the list has grown.
var table [shards]shard

const shards = 64

type entry struct {
	msg *message.Message
	c   Charge
}

type shard struct {
	mu      sync.Mutex
	entries []entry
	_       [32]byte // keeps neighbouring shards' locks off one cache line
}

// shardOf picks msg's shard from its address: heap objects do not move,
// and a message handed to Set is on the heap (the table holds it).
func shardOf(msg *message.Message) *shard {
	p := uint64(reflect.ValueOf(msg).Pointer())
	// Fibonacci hashing: the top bits of the product mix every bit of
	// the address, including those above the allocator's size classes.
	return &table[(p*0x9E3779B97F4A7C15)>>(64-6)]
}

// find returns the index of msg's newest entry in s, or -1. Entries are
// kept in the order they were set, so the scan goes backwards.
func (s *shard) find(msg *message.Message) int {
	for i := len(s.entries) - 1; i >= 0; i-- {
		if s.entries[i].msg == msg {
			return i
		}
	}
	return -1
}

// Record undoes a [Set]. It is two words, so that callers keep it in
// registers.
type Record struct {
	s   *shard
	msg *message.Message
}

// Set records c for msg, for as long as the caller runs msg's inner
// handler; call Restore on the result when it returns. A message admitted
// again inside (nested budgets) gets a newer entry, which [Get] reads
// until its own Restore.
func Set(msg *message.Message, c Charge) Record {
	s := shardOf(msg)
	s.mu.Lock()
	s.entries = append(s.entries, entry{msg: msg, c: c})
	s.mu.Unlock()
	return Record{s: s, msg: msg}
}

// Restore removes the entry the Set that returned r added: the newest of
// its message, since Sets and Restores of one message nest.
func (r Record) Restore() {
	s := r.s
	if s == nil {
		return
	}
	s.mu.Lock()
	if i := s.find(r.msg); i >= 0 {
		// Keep the order (a nested entry stays after its outer one);
		// the entries after i are the few messages set since.
		last := len(s.entries) - 1
		copy(s.entries[i:], s.entries[i+1:])
		s.entries[last].msg = nil // drop the reference to the message
		s.entries = s.entries[:last]
	}
	s.mu.Unlock()
}

// wanted says some layer may call Get: only then is Set worth its locks.
var wanted atomic.Bool

// Want declares that a layer reading the granted charge exists in this
// process; the budget middleware records charges from then on. Call it
// when building such a layer, before it handles a message.
func Want() { wanted.Store(true) }

// Wanted reports whether Want has been called.
func Wanted() bool { return wanted.Load() }

// Get returns the charge msg was admitted with, if a budget middleware is
// running it now.
func Get(msg *message.Message) (Charge, bool) {
	s := shardOf(msg)
	s.mu.Lock()
	var c Charge
	i := s.find(msg)
	if i >= 0 {
		c = s.entries[i].c
	}
	s.mu.Unlock()
	return c, i >= 0
}
