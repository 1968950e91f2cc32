package telemetry_test

import (
	"math"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/telemetry"
)

// Issue 13, item 7: spillway.processed.vertices added the raw vertex_count,
// so one forged math.MaxInt64 header made the counter meaningless and a
// second one wrapped it negative. An admitted message adds what the budget
// granted; a count read from the message itself is capped.
func TestEdgeProcessedVerticesForgedCount(t *testing.T) {
	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp),
		telemetry.WithTopicFunc(func(*message.Message) string { return "t" }))
	if err != nil {
		t.Fatal(err)
	}
	forged := strconv.FormatInt(math.MaxInt64, 10)
	run := func(a *middleware.Admission) {
		h := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if a != nil {
				m.OnAdmission(msg, *a)
			}
			return nil, nil
		})
		msg := message.NewMessage("x", []byte("{}"))
		msg.Metadata.Set("vertex_count", forged)
		_, _ = h(msg)
	}
	for range 2 {
		run(&middleware.Admission{
			Charge:  cost.Charge{Vertices: math.MaxInt64, Messages: 1, Source: cost.SourceHeader},
			Granted: 20_000, Result: middleware.Admitted,
		})
	}
	rm := collect(t, reader)
	if got := mustPoint(t, rm, "spillway.processed.vertices", map[string]string{"topic": "t", "outcome": "handled"}); got != 40_000 {
		t.Errorf("processed vertices of two admitted forged messages = %v, want the 40000 granted", got)
	}
	// Without an admission (no budget in the stack), the header is all
	// there is: capped, so the sum stays positive and bounded.
	for range 3 {
		run(nil)
	}
	rm = collect(t, reader)
	got := mustPoint(t, rm, "spillway.processed.vertices", map[string]string{"topic": "t", "outcome": "handled"})
	if want := 40_000 + 3*float64(int64(1)<<40); got != want {
		t.Errorf("processed vertices = %v, want %v (three headers capped at 2⁴⁰, the largest capacity)", got, want)
	}
}
