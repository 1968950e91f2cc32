// Package granted carries the charge a message was admitted with from the
// budget middleware (package middleware) to the layers that run inside it,
// such as the auto-sizer (package sizing), which must not import each
// other. Those layers then read the charge the budget granted, clamped to
// its capacity, instead of pricing the message a second time.
//
// The record lives for as long as the budget middleware runs the inner
// handler and is keyed by the message itself, so it survives layers that
// replace the message's context.
package granted

import (
	"hash/maphash"
	"sync"

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
// is sharded by the message's address, each shard a plain map under its own
// mutex: unlike a sync.Map, setting and deleting a key allocates nothing
// once a shard's map has grown, and concurrent messages rarely share a
// shard's lock.
var table [shards]shard

const shards = 16

type shard struct {
	mu sync.Mutex
	m  map[*message.Message]Charge
	_  [40]byte // keeps neighbouring shards' locks off one cache line
}

var seed = maphash.MakeSeed()

func shardOf(msg *message.Message) *shard {
	return &table[maphash.Comparable(seed, msg)%shards]
}

// Set records c for msg and returns what it replaced, for [Restore].
func Set(msg *message.Message, c Charge) (prev Charge, had bool) {
	s := shardOf(msg)
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[*message.Message]Charge)
	}
	prev, had = s.m[msg]
	s.m[msg] = c
	s.mu.Unlock()
	return prev, had
}

// Restore undoes a [Set]: it puts back what Set returned.
func Restore(msg *message.Message, prev Charge, had bool) {
	s := shardOf(msg)
	s.mu.Lock()
	if had {
		s.m[msg] = prev
	} else {
		delete(s.m, msg)
	}
	s.mu.Unlock()
}

// Get returns the charge msg was admitted with, if a budget middleware is
// running it now.
func Get(msg *message.Message) (Charge, bool) {
	s := shardOf(msg)
	s.mu.Lock()
	c, ok := s.m[msg]
	s.mu.Unlock()
	return c, ok
}
