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

var table sync.Map // *message.Message -> Charge

// Set records c for msg and returns what it replaced, for [Restore].
func Set(msg *message.Message, c Charge) (prev Charge, had bool) {
	p, loaded := table.Swap(msg, c)
	if loaded {
		prev = p.(Charge)
	}
	return prev, loaded
}

// Restore undoes a [Set]: it puts back what Set returned.
func Restore(msg *message.Message, prev Charge, had bool) {
	if had {
		table.Store(msg, prev)
		return
	}
	table.Delete(msg)
}

// Get returns the charge msg was admitted with, if a budget middleware is
// running it now.
func Get(msg *message.Message) (Charge, bool) {
	v, ok := table.Load(msg)
	if !ok {
		return Charge{}, false
	}
	return v.(Charge), true
}
