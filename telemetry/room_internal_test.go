package telemetry

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/spillway-go/spillway/internal/stackprobe"
	"github.com/spillway-go/spillway/internal/telhint"
)

// On the quiet path (no span to start) of a stack composed by hand, the
// tracing middleware grows a message goroutine's stack at the top only
// while the chain below is seen to outgrow the stack the goroutine starts
// with: a shallow chain stops being grown, a deep one keeps being grown.
// Below a router whose stack fits (StackFits), the gauge is not used.
func TestQuietPathGrowsOnlyForDeepChains(t *testing.T) {
	stackprobe.QuietRuntime(t)

	noop := []Option{WithTracerProvider(tracenoop.NewTracerProvider()), WithPropagator(propagation.TraceContext{})}
	// run passes n messages through tr's middleware around h, each on a
	// goroutine of its own, as Watermill's router does.
	run := func(tr *tracing, h message.HandlerFunc, n int) {
		mw := tr.middleware(h)
		for range n {
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = mw(message.NewMessage("m", nil))
			}()
			<-done
		}
	}
	shallow := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	deep := func(*message.Message) ([]*message.Message, error) {
		stackprobe.Descend(32) // over 4 KiB
		return nil, nil
	}
	const n = 3000 // about 190 messages watched: a dozen decisions

	t.Run("shallow", func(t *testing.T) {
		tr := newTracing(noop...)
		if !tr.room.Grow() {
			t.Fatal("the gauge does not grow before it has watched anything")
		}
		run(tr, shallow, n)
		if tr.room.Grow() {
			t.Error("still growing the stack for a chain that fits")
		}
	})
	t.Run("deep", func(t *testing.T) {
		tr := newTracing(noop...)
		run(tr, shallow, n)
		run(tr, deep, n)
		if !tr.room.Grow() {
			t.Error("not growing the stack for a chain that outgrows it")
		}
	})
	t.Run("stack fits", func(t *testing.T) {
		tr := newTracing(append(noop, telhint.StackFits().(Option))...)
		run(tr, shallow, n)
		if !tr.room.Grow() {
			t.Error("the gauge learned below a router whose stack fits: it watched messages there")
		}
	})
}
