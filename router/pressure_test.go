package router

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/telemetry"
)

// shedding.pressure picks the signal priority shedding waits on: the
// budget, the consumer lag, or whichever has lasted longer.
func TestSheddingPressureSignals(t *testing.T) {
	var lag atomic.Int64
	src := telemetry.LagSource(func(context.Context) ([]telemetry.LagSample, error) {
		return []telemetry.LagSample{{Topic: "positions", Group: "g", Partition: 0, Lag: lag.Load()}}, nil
	})
	ls := telemetry.NewLagSampler(src, telemetry.WithLagThreshold(10), telemetry.WithLagInterval(time.Hour))
	vb := mustVertexBudget(100)
	r := &Router{budget: vb, lagSampler: ls}
	budget, lagP, either := r.sheddingPressure(pressureBudget), r.sheddingPressure(pressureLag), r.sheddingPressure(pressureEither)
	sample := func() {
		t.Helper()
		if err := ls.Sample(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, wantBudget, wantLag bool) {
		t.Helper()
		got := []bool{budget.SaturatedFor() > 0, lagP.SaturatedFor() > 0, either.SaturatedFor() > 0}
		want := []bool{wantBudget, wantLag, wantBudget || wantLag}
		for i, name := range []string{"budget", "lag", "either"} {
			if got[i] != want[i] {
				t.Errorf("%s: %s pressure %v, want %v", when, name, got[i], want[i])
			}
		}
	}

	sample()
	check("idle", false, false)

	lag.Store(50) // above the threshold of 10
	sample()
	time.Sleep(5 * time.Millisecond)
	check("lagging", false, true)

	// Saturate the budget: all of it in use and a message waiting.
	p, err := vb.Acquire(context.Background(), 100) // idle budget: admitted at once
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		if q, err := vb.Acquire(ctx, 10); err == nil {
			q.Release()
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for vb.Stats().Waiting == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond)
	lag.Store(0)
	sample()
	check("saturated, caught up", true, false)
	cancel()
	<-waited
	p.Release()

	// Before the sampler exists (or with telemetry off) lag is no pressure.
	if d := (&Router{budget: vb}).sheddingPressure(pressureLag).SaturatedFor(); d != 0 {
		t.Errorf("lag pressure without a sampler: %v", d)
	}
}

// mustVertexBudget is middleware.NewVertexBudget for capacities the test knows
// are valid.
func mustVertexBudget(capacity int64, opts ...middleware.Option) *middleware.VertexBudget {
	b, err := middleware.NewVertexBudget(capacity, opts...)
	if err != nil {
		panic(err)
	}
	return b
}
