package telemetry_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/telemetry"
)

// A LineString of 4 vertices.
var line4 = []byte(`{"type":"LineString","coordinates":[[0,0],[1,1],[2,2],[3,3]]}`)

// fate simulates the stages that decide a message's outcome through hooks
// (shedding, retry gating): the "fate" metadata says what happens.
func fate(m *telemetry.Metrics) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			switch msg.Metadata.Get("fate") {
			case "shed":
				m.OnShed(msg, "", "shed_priority")
				return nil, nil
			case "superseded":
				m.OnShed(msg, "", "superseded")
				return nil, nil
			case "deferred":
				m.OnDeferred(msg, "", "saturated")
				return nil, nil
			case "dead":
				if _, err := h(msg); err != nil {
					m.OnDeadLettered(msg, "", "permanent")
				}
				return nil, nil
			}
			return h(msg)
		}
	}
}

type fullStack struct {
	tp      *sdktrace.TracerProvider
	spans   func() []sdktrace.ReadOnlySpan
	metrics *telemetry.Metrics
	reader  *sdkmetric.ManualReader
	budget  *middleware.VertexBudget
	pub     message.Publisher
	router  *memoryRouter
}

func newFullStack(t *testing.T, capacity int64, handler message.NoPublishHandlerFunc) *fullStack {
	t.Helper()
	tp, sr := newTracerProvider()
	mp, reader := newMeterProvider()
	prop := propagation.TraceContext{}
	metrics, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	tracing := telemetry.NewTracing(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(prop),
		telemetry.WithMessagingSystem("gochannel"), telemetry.WithConsumerGroup("workers"))
	budget := mustVertexBudget(capacity)
	admission, err := middleware.New(budget, middleware.WithOnAdmission(metrics.OnAdmission))
	if err != nil {
		t.Fatal(err)
	}
	r := startMemoryRouter(t, "parcels", handler, tracing, metrics.Middleware, fate(metrics), admission.Middleware)
	pub := telemetry.NewTracingPublisher(cost.NewStampingPublisher(r.pubSub),
		telemetry.WithTracerProvider(tp), telemetry.WithPropagator(prop), telemetry.WithMessagingSystem("gochannel"))
	return &fullStack{tp: tp, spans: sr.Ended, metrics: metrics, reader: reader, budget: budget, pub: pub, router: r}
}

// The consumer span is the child of the producer span, which is the child
// of the span active when the message was created; the consumer span
// carries the messaging and Spillway attributes.
func TestTracingParentChildOverMemory(t *testing.T) {
	var handled sync.WaitGroup
	handled.Add(1)
	var sawSpan atomic.Bool
	stack := newFullStack(t, 1000, func(msg *message.Message) error {
		defer handled.Done()
		sawSpan.Store(trace.SpanFromContext(msg.Context()).SpanContext().IsValid())
		trace.SpanFromContext(msg.Context()).SetAttributes(attribute.String("handler", "parcels"))
		return nil
	})

	ctx, root := stack.tp.Tracer("test").Start(context.Background(), "request")
	msg := message.NewMessage("m-1", line4)
	msg.Metadata.Set("spillway_attempt", "2")
	msg.SetContext(ctx)
	if err := stack.pub.Publish("parcels", msg); err != nil {
		t.Fatal(err)
	}
	root.End()
	handled.Wait()
	stack.router.close()

	if !sawSpan.Load() {
		t.Fatal("handler saw no span in its message context")
	}
	spans := stack.spans()
	producer := spanByMessage(t, spans, "send parcels", "m-1")
	consumer := spanByMessage(t, spans, "process parcels", "m-1")

	if producer.Parent().SpanID() != root.SpanContext().SpanID() {
		t.Fatalf("producer parent = %v, want the request span", producer.Parent().SpanID())
	}
	if consumer.Parent().SpanID() != producer.SpanContext().SpanID() || !consumer.Parent().IsRemote() {
		t.Fatalf("consumer parent = %v (remote %v), want the producer span %v",
			consumer.Parent().SpanID(), consumer.Parent().IsRemote(), producer.SpanContext().SpanID())
	}
	if consumer.SpanContext().TraceID() != root.SpanContext().TraceID() {
		t.Fatal("consumer span is in another trace")
	}
	if producer.SpanKind() != trace.SpanKindProducer || consumer.SpanKind() != trace.SpanKindConsumer {
		t.Fatalf("kinds: producer %v, consumer %v", producer.SpanKind(), consumer.SpanKind())
	}

	wantConsumer := map[string]any{
		"messaging.system":                "gochannel",
		"messaging.operation.type":        "process",
		"messaging.operation.name":        "process",
		"messaging.destination.name":      "parcels",
		"messaging.message.id":            "m-1",
		"messaging.consumer.group.name":   "workers",
		"messaging.message.body.size":     int64(len(line4)),
		"spillway.retry.attempt":          int64(2),
		"spillway.vertices":               int64(4),
		"spillway.vertices.granted":       int64(4),
		"spillway.cost.source":            "header",
		"spillway.admission.outcome":      "admitted",
		"spillway.admission.clamped":      false,
		"spillway.outcome":                "handled",
		"handler":                         "parcels",
		"spillway.admission.wait_seconds": float64(0),
	}
	got := attrMap(consumer.Attributes())
	for k, v := range wantConsumer {
		if got[k] != v {
			t.Errorf("consumer %s = %v (%T), want %v (%T)", k, got[k], got[k], v, v)
		}
	}
	if consumer.Status().Code != codes.Unset {
		t.Errorf("consumer status %v, want unset", consumer.Status())
	}
	gotP := attrMap(producer.Attributes())
	for k, v := range map[string]any{
		"messaging.system":           "gochannel",
		"messaging.operation.type":   "send",
		"messaging.destination.name": "parcels",
		"messaging.message.id":       "m-1",
		"spillway.vertices":          int64(4), // stamped inside the tracing publisher
	} {
		if gotP[k] != v {
			t.Errorf("producer %s = %v, want %v", k, gotP[k], v)
		}
	}
	if msg.Metadata.Get("traceparent") == "" {
		t.Error("no traceparent in the published message's metadata")
	}
}

// A message that waited for budget records the wait on its span.
func TestTracingAdmissionWait(t *testing.T) {
	release := make(chan struct{})
	var handled sync.WaitGroup
	handled.Add(2)
	stack := newFullStack(t, 5, func(msg *message.Message) error {
		defer handled.Done()
		if msg.UUID == "first" {
			<-release
		}
		return nil
	})
	if err := stack.pub.Publish("parcels", message.NewMessage("first", line4)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "first admitted", func() bool { return stack.budget.Stats().InUse == 4 })
	if err := stack.pub.Publish("parcels", message.NewMessage("second", line4)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "second waiting", func() bool { return stack.budget.Stats().Waiting == 1 })
	close(release)
	handled.Wait()
	stack.router.close()

	second := attrMap(spanByMessage(t, stack.spans(), "process parcels", "second").Attributes())
	if w, _ := second["spillway.admission.wait_seconds"].(float64); !(w > 0) {
		t.Fatalf("second message wait = %v, want > 0", second["spillway.admission.wait_seconds"])
	}
}

// Errors, panics and hook-decided outcomes end up on the spans.
func TestTracingOutcomesAndStatus(t *testing.T) {
	var handled sync.WaitGroup
	var seen sync.Map // first deliveries only: nacked messages come back
	stack := newFullStack(t, 1000, func(msg *message.Message) error {
		if _, again := seen.LoadOrStore(msg.UUID, true); !again {
			defer handled.Done()
		}
		switch msg.Metadata.Get("fate") {
		case "fail", "dead":
			return errors.New("bad geometry")
		case "panic":
			panic("boom")
		}
		return nil
	})
	fates := map[string]string{
		"ok": "", "fail": "fail", "panic": "panic", "dead": "dead",
		"shed": "shed", "deferred": "deferred", "superseded": "superseded",
	}
	for id, f := range fates {
		if f == "" || f == "fail" || f == "panic" || f == "dead" {
			handled.Add(1)
		}
		m := message.NewMessage(id, line4)
		if f != "" {
			m.Metadata.Set("fate", f)
		}
		if err := stack.pub.Publish("parcels", m); err != nil {
			t.Fatal(err)
		}
	}
	handled.Wait()
	// "fail" and "panic" are nacked and redelivered by the GoChannel; wait
	// until every message has at least one consumer span, then stop.
	waitUntil(t, "all spans", func() bool {
		seen := map[string]bool{}
		for _, s := range spansNamed(stack.spans(), "process parcels") {
			seen[attrMap(s.Attributes())["messaging.message.id"].(string)] = true
		}
		return len(seen) == len(fates)
	})
	stack.router.close()

	spans := stack.spans()
	for id, want := range map[string]struct {
		outcome string
		status  codes.Code
		reason  string
	}{
		"ok":         {"handled", codes.Unset, ""},
		"fail":       {"error", codes.Error, ""},
		"panic":      {"panic", codes.Error, ""},
		"dead":       {"dead_lettered", codes.Error, "permanent"},
		"shed":       {"shed", codes.Unset, "shed_priority"},
		"deferred":   {"deferred", codes.Unset, "saturated"},
		"superseded": {"superseded", codes.Unset, "superseded"},
	} {
		s := spanByMessage(t, spans, "process parcels", id)
		a := attrMap(s.Attributes())
		if a["spillway.outcome"] != want.outcome || s.Status().Code != want.status {
			t.Errorf("%s: outcome %v status %v, want %s %v", id, a["spillway.outcome"], s.Status(), want.outcome, want.status)
		}
		if want.reason != "" && a["spillway.outcome.reason"] != want.reason {
			t.Errorf("%s: reason %v, want %s", id, a["spillway.outcome.reason"], want.reason)
		}
	}
	fail := spanByMessage(t, spans, "process parcels", "fail")
	if a := attrMap(fail.Attributes()); a["error.type"] == nil {
		t.Error("failed span has no error.type")
	}
	if len(fail.Events()) == 0 || fail.Events()[0].Name != "exception" {
		t.Error("failed span has no exception event")
	}
	if d := spanByMessage(t, spans, "process parcels", "panic").Status().Description; d != "panic: boom" {
		t.Errorf("panic status %q", d)
	}
}

// The publisher injects the ambient span without a producer span when
// asked, and a publish error ends up on the producer span.
func TestTracingPublisherOptions(t *testing.T) {
	tp, sr := newTracerProvider()
	prop := propagation.TraceContext{}
	ctx, root := tp.Tracer("test").Start(context.Background(), "request")
	defer root.End()

	rec := &recorder{}
	plain := telemetry.NewTracingPublisher(rec, telemetry.WithTracerProvider(tp), telemetry.WithPropagator(prop),
		telemetry.WithProducerSpans(false))
	m := message.NewMessage("a", nil)
	m.SetContext(ctx)
	if err := plain.Publish("t", m); err != nil {
		t.Fatal(err)
	}
	sc := trace.SpanContextFromContext(prop.Extract(context.Background(), telemetry.NewMetadataCarrier(m)))
	if sc.SpanID() != root.SpanContext().SpanID() {
		t.Fatalf("injected span %v, want the ambient %v", sc.SpanID(), root.SpanContext().SpanID())
	}
	if n := len(sr.Ended()); n != 0 {
		t.Fatalf("%d spans ended without producer spans", n)
	}

	boom := errors.New("broker down")
	failing := telemetry.NewTracingPublisher(&recorder{err: boom}, telemetry.WithTracerProvider(tp), telemetry.WithPropagator(prop),
		telemetry.WithAttributes(func(*message.Message) []attribute.KeyValue {
			return []attribute.KeyValue{attribute.String("extra", "yes")}
		}))
	b1, b2 := message.NewMessage("b1", nil), message.NewMessage("b2", nil)
	if err := failing.Publish("t", b1, b2, nil); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the broker's", err)
	}
	sends := spansNamed(sr.Ended(), "send t")
	if len(sends) != 2 {
		t.Fatalf("%d send spans, want 2", len(sends))
	}
	for _, s := range sends {
		a := attrMap(s.Attributes())
		if s.Status().Code != codes.Error || a["messaging.batch.message_count"] != int64(3) || a["extra"] != "yes" {
			t.Errorf("send span: status %v, attrs %v", s.Status(), a)
		}
	}
}

// Hooks work (and do nothing harmful) without any telemetry middleware.
func TestHooksWithoutMiddleware(t *testing.T) {
	msg := message.NewMessage("x", nil)
	m, err := telemetry.NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	m.OnShed(msg, "", "x")
	m.OnShed(nil, "", "x")
	m.OnDeferred(msg, "", "x")
	m.OnDeferred(nil, "", "x")
	m.OnDeadLettered(msg, "", "x")
	m.OnDeadLettered(nil, "", "x")
	m.OnAdmission(msg, middleware.Admission{Result: middleware.Revoked})
	m.OnAdmission(msg, middleware.Admission{})
	m.OnAdmission(nil, middleware.Admission{})
	m.Count(context.Background(), "handled", "t", "", 1) // no counter: ignored
}
