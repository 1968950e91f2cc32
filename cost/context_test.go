package cost_test

import (
	"context"
	"testing"

	"github.com/spillway-go/spillway/cost"
)

type otherKey struct{}

// A context carries the admitted charge it was given, and a bare one none;
// the innermost WithAdmitted wins.
func TestAdmittedFromCtx(t *testing.T) {
	if c, ok := cost.AdmittedFromCtx(context.Background()); ok {
		t.Fatalf("a bare context carries admitted charge %+v", c)
	}
	want := cost.Charge{Vertices: 7, Messages: 1, Source: cost.SourceComputed}
	ctx := cost.WithAdmitted(context.Background(), cost.Charge{Vertices: 99})
	if got, ok := cost.AdmittedFromCtx(cost.WithAdmitted(ctx, want)); !ok || got != want {
		t.Fatalf("AdmittedFromCtx = %+v, %v; want %+v", got, ok, want)
	}
}

// The admitted context is its parent in every other respect: the parent's
// values, its cancellation and cause, and contexts derived from it.
func TestWithAdmittedKeepsParent(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), otherKey{}, "v"))
	ctx := cost.WithAdmitted(parent, cost.Charge{Vertices: 1})
	child, stop := context.WithCancel(ctx)
	defer stop()
	if ctx.Value(otherKey{}) != "v" || child.Value(otherKey{}) != "v" {
		t.Fatal("the parent's value is lost")
	}
	if _, ok := cost.AdmittedFromCtx(child); !ok {
		t.Fatal("a derived context lost the admitted charge")
	}
	cause := context.Canceled
	cancel(cause)
	select {
	case <-child.Done():
	default:
		t.Fatal("cancelling the parent did not reach a context derived from the admitted one")
	}
	if ctx.Err() == nil || context.Cause(ctx) != cause {
		t.Fatalf("Err = %v, Cause = %v; want the parent's", ctx.Err(), context.Cause(ctx))
	}
}
