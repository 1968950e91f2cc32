package stackroom

import (
	"testing"

	"github.com/spillway-go/spillway/internal/stackprobe"
)

// A zero Gauge grows; after each window of watched calls it grows only if
// more than half of them moved the stack.
func TestGaugeDecides(t *testing.T) {
	var g Gauge
	if !g.Grow() {
		t.Fatal("a zero Gauge does not grow")
	}
	observe := func(moved, still int) {
		for range moved {
			g.Observe(true)
		}
		for range still {
			g.Observe(false)
		}
	}
	for _, c := range []struct {
		moved, still int
		grow         bool
	}{
		{0, window, false},
		{window / 2, window / 2, false},
		{window/2 + 1, window/2 - 1, true},
		{window, 0, true},
		{1, window - 1, false},
	} {
		observe(c.moved, c.still)
		if g.Grow() != c.grow {
			t.Errorf("after a window with %d of %d moved: Grow() = %v, want %v", c.moved, window, g.Grow(), c.grow)
		}
	}
	// Within a window the decision stands.
	observe(window-1, 0)
	if g.Grow() {
		t.Error("the gauge decided before the window was complete")
	}
}

// Watch picks about one call in watchEvery.
func TestGaugeWatchRate(t *testing.T) {
	var g Gauge
	const n = 160_000
	watched := 0
	for range n {
		if g.Watch() {
			watched++
		}
	}
	if want := n / watchEvery; watched < want*8/10 || watched > want*12/10 {
		t.Fatalf("Watch picked %d of %d calls, want about %d", watched, n, want)
	}
}

// Here returns the same address twice from one function call unless the
// stack moved in between: a new goroutine's stack, grown by a deep call,
// moves.
func TestHere(t *testing.T) {
	stackprobe.QuietRuntime(t)
	type result struct{ still, moved bool }
	got := make(chan result)
	go func() {
		a := Here()
		b := Here()
		c := Here()
		stackprobe.Descend(64) // 8 KiB and more
		d := Here()
		got <- result{still: a == b && b == c, moved: c != d}
	}()
	r := <-got
	if !r.still {
		t.Error("Here moved without the stack moving")
	}
	if !r.moved {
		t.Error("Here did not see the stack move")
	}
}
