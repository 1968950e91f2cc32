package stackroom

import (
	"math/rand/v2"
	"sync/atomic"
	"unsafe"
)

// A caller that cannot know how deep the chain below it reaches (a
// middleware composed by hand, whose layers and handler the application
// chooses) would otherwise have to grow the stack for every message,
// about 1.5 µs each, whether the chain needs it or not. A Gauge lets it
// find out: it runs one call in watchEvery without growing first and
// looks whether the stack moved meanwhile.
const (
	// watchEvery: one call in watchEvery is watched, on average.
	watchEvery = 16
	// window: the gauge decides again after every window watched calls.
	window = 16
)

// Gauge learns whether a call chain outgrows the stack of the goroutine
// it runs on, so that its caller grows the stack first ([Reserve]) only
// for a chain that needs it. The caller asks [Gauge.Watch] before each
// call: a watched call runs without growing first, bracketed by [Here],
// and its result goes to [Gauge.Observe]; any other call grows the stack
// first if [Gauge.Grow] says so.
//
// After every window of watched calls the gauge decides again: it keeps
// growing while more than half of the window moved the stack, and stops
// once no more than half did. A zero Gauge grows, the safe choice until
// it has watched a window. Safe for concurrent use; it never blocks.
type Gauge struct {
	fits    atomic.Bool // the last window found the chain fits: no growth
	watched atomic.Uint32
	moved   atomic.Uint32
}

// Watch reports whether the next call is to be watched: run without
// growing the stack first, with its result passed to Observe. One call
// in 16, at random.
func (g *Gauge) Watch() bool {
	return rand.Uint32()%watchEvery == 0
}

// Grow reports whether a call that is not watched should grow the stack
// first.
func (g *Gauge) Grow() bool {
	return !g.fits.Load()
}

// Observe records whether a watched call moved the stack.
func (g *Gauge) Observe(moved bool) {
	if moved {
		g.moved.Add(1)
	}
	if g.watched.Add(1)%window == 0 {
		g.fits.Store(g.moved.Swap(0) <= window/2)
	}
}

// Here returns where its frame lies on the calling goroutine's stack. Two
// calls from the same function call differ only if the goroutine's stack
// moved (grew or shrank by being copied) between them.
//
//go:noinline
func Here() uintptr {
	var mark byte
	return uintptr(unsafe.Pointer(&mark))
}
