package cost_test

import (
	"context"
	"testing"

	"github.com/spillway-go/spillway/cost"
)

// A context carries the admitted charge it was given, and a bare one none.
func TestAdmittedFromCtx(t *testing.T) {
	if c, ok := cost.AdmittedFromCtx(context.Background()); ok {
		t.Fatalf("a bare context carries admitted charge %+v", c)
	}
	want := cost.Charge{Vertices: 7, Messages: 1, Source: cost.SourceComputed}
	if got, ok := cost.AdmittedFromCtx(cost.WithAdmitted(context.Background(), want)); !ok || got != want {
		t.Fatalf("AdmittedFromCtx = %+v, %v; want %+v", got, ok, want)
	}
}
