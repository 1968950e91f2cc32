package telemetry_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/telemetry"
)

type failingExporter struct{ calls atomic.Int64 }

func (e *failingExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	e.calls.Add(1)
	return errors.New("collector unreachable")
}

func (e *failingExporter) Shutdown(context.Context) error { return nil }

type countingHandler struct{ n atomic.Int64 }

func (h *countingHandler) Handle(error) { h.n.Add(1) }

// Telemetry never fails a message: with an exporter that fails every
// export, with nil providers and with the (no-op) globals, every message
// is handled once and acked.
func TestTelemetryNeverFailsAMessage(t *testing.T) {
	prev := otel.GetErrorHandler()
	errs := &countingHandler{}
	otel.SetErrorHandler(errs)
	defer otel.SetErrorHandler(prev)

	exp := &failingExporter{}
	failingTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = failingTP.Shutdown(context.Background()) }()

	for name, opts := range map[string][]telemetry.Option{
		"failing exporter": {telemetry.WithTracerProvider(failingTP), telemetry.WithPropagator(propagation.TraceContext{})},
		"nil providers":    {telemetry.WithTracerProvider(nil), telemetry.WithMeterProvider(nil), telemetry.WithPropagator(nil)},
		"globals":          nil,
	} {
		t.Run(name, func(t *testing.T) {
			const n = 20
			var calls sync.Map
			var wg sync.WaitGroup
			wg.Add(n)
			metrics, err := telemetry.NewMetrics(opts...)
			if err != nil {
				t.Fatal(err)
			}
			budget := mustVertexBudget(100)
			admission, _ := middleware.New(budget, middleware.WithOnAdmission(metrics.OnAdmission))
			r := startMemoryRouter(t, "t", func(msg *message.Message) error {
				if _, again := calls.LoadOrStore(msg.UUID, true); again {
					t.Errorf("message %s delivered twice", msg.UUID)
					return nil
				}
				wg.Done()
				return nil
			}, telemetry.NewTracing(opts...), metrics.Middleware, admission.Middleware)
			pub := telemetry.NewTracingPublisher(r.pubSub, opts...)
			for i := range n {
				m := message.NewMessage(strconv.Itoa(i), []byte("x"))
				m.Metadata.Set("vertex_count", "3")
				if err := pub.Publish("t", m); err != nil {
					t.Fatalf("publish: %v", err)
				}
			}
			wg.Wait()
			r.close()
			if budget.Stats().InUse != 0 {
				t.Fatal("budget not refunded")
			}
		})
	}
	if exp.calls.Load() == 0 || errs.n.Load() == 0 {
		t.Fatalf("the exporter was not exercised: %d exports, %d errors handled", exp.calls.Load(), errs.n.Load())
	}
}
