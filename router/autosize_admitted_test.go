package router

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
)

// pricedOnce counts how often it prices the messages of the test.
type pricedOnce struct {
	cost.ChargeEstimator
	calls atomic.Int64
}

func (e *pricedOnce) Estimate(msg *message.Message) cost.Charge {
	if strings.HasPrefix(msg.UUID, "shape-") {
		e.calls.Add(1)
	}
	return e.ChargeEstimator.Estimate(msg)
}

// In the router's stack the auto-sizer sits inside admission, below the
// layer that gives the handler its delivery context back: it still finds
// the charge the budget admitted the message with, so a message without
// vertex_count has its geometry counted once, not a second time for the
// sizer.
func TestAutoSizerReadsAdmittedChargeInRouter(t *testing.T) {
	g := newGochannelBroker()
	cfg := Config{CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = 100_000
	cfg.Retry.Disabled = true
	cfg.Telemetry.Disabled = true
	a := &cfg.Budget.AutoSize
	a.Enabled = true
	a.Window, a.Windows, a.MinWindows = 30*time.Millisecond, 1, 1
	a.Ceiling, a.Hysteresis, a.TailShare = 1_000_000, spillway.Off, spillway.Off
	est := &pricedOnce{ChargeEstimator: cost.NewEstimator(cost.FullBudget, cost.WithComputeMissing())}

	r, err := New(cfg, nil, WithBroker(g.custom(20*time.Second)), WithEstimator(est))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	done := make(chan string, 100)
	if _, err := r.AddConsumerHandler("count", "shapes.in", func(msg *message.Message) error {
		time.Sleep(3 * time.Millisecond) // long enough to close a sizer window
		done <- msg.UUID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.Background()) }()
	<-r.Running()

	const n = 20
	for i := range n {
		// Straight onto the channel, past the router's stamping publisher:
		// no vertex_count, so the estimator counts the geometry.
		msg := message.NewMessage(fmt.Sprintf("shape-%d", i), geojsonPayload(t, heavyGeometry(t, i*7, 50)))
		if err := g.ch.Publish("shapes.in", msg); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the messages did not reach the handler")
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
	if got := est.calls.Load(); got != n {
		t.Errorf("%d messages priced %d times, want %d: the auto-sizer priced them again", n, got, n)
	}
	if r.sizer.Bounds().VerticesPerSecond == 0 {
		t.Error("the auto-sizer measured nothing")
	}
}
