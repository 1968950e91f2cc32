package stackprobe

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// A chain that writes a 1,500-byte local is measured at least that deep,
// and not much deeper; one that calls nothing stays above the painted
// region. Messages probed at once are each measured.
func TestProbeDepth(t *testing.T) {
	p := new(Probe)
	deepH := p.Middleware(func(*message.Message) ([]*message.Message, error) {
		deep()
		return nil, nil
	})
	const n = 8
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := deepH(message.NewMessage("m", nil)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	median, deepest, got := p.Depths()
	if got != n || p.Moved() != 0 {
		t.Fatalf("measured %d of %d messages (%d moved)", got, n, p.Moved())
	}
	if median < deepFrame || deepest > deepFrame+256 {
		t.Errorf("a chain with a %d-byte frame measured %d (median) to %d bytes deep", deepFrame, median, deepest)
	}
	// The path to that depth names deep, which called sum from there.
	path := p.Path(median)
	if !slices.ContainsFunc(path, func(s string) bool { return strings.Contains(s, "stackprobe.deep:") }) {
		t.Errorf("the path to %d bytes does not name deep: %q", median, path)
	}
	if p.Path(median+1) != nil {
		t.Errorf("a path for a depth no message reached")
	}

	q := new(Probe)
	shallow := q.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := shallow(message.NewMessage("m", nil)); err != nil {
		t.Fatal(err)
	}
	if median, _, got := q.Depths(); got != 1 || median != 0 {
		t.Errorf("an empty handler measured %d bytes deep (%d messages)", median, got)
	}
}

const deepFrame = 1500

//go:noinline
func deep() byte {
	var b [deepFrame]byte
	for i := range b {
		b[i] = byte(i)
	}
	return sum(&b)
}

//go:noinline
func sum(b *[deepFrame]byte) byte { return b[0] + b[deepFrame-1] }

// On a new goroutine's stack, a chain that writes a 16 KiB local moves the
// stack and one that calls nothing does not. (16 KiB, not 2: the runtime
// starts goroutines with the average stack it has seen, 2 KiB or more.)
func TestMoves(t *testing.T) {
	var m Moves
	deepH := m.Middleware(func(*message.Message) ([]*message.Message, error) {
		huge()
		return nil, nil
	})
	shallow := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	run := func(h message.HandlerFunc) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := h(message.NewMessage("m", nil)); err != nil {
				t.Error(err)
			}
		}()
		<-done
	}
	run(shallow)
	if moved, n := m.Counts(); moved != 0 || n != 1 {
		t.Fatalf("an empty handler: %d of %d moved, want 0 of 1", moved, n)
	}
	run(deepH)
	if moved, n := m.Counts(); moved != 1 || n != 2 {
		t.Fatalf("a 16 KiB frame: %d of %d moved, want 1 of 2", moved, n)
	}
}

//go:noinline
func huge() byte {
	var b [16 << 10]byte
	for i := range b {
		b[i] = byte(i)
	}
	return b[len(b)/2] + b[len(b)-1]
}
