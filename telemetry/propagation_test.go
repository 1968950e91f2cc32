package telemetry_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/telemetry"
)

// With the W3C propagator the consumer span is the child of the
// producer's span, and with the no-op tracer (no span started) the
// handler sees the producer's span context.
func TestTracingW3CParentInContext(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": tp}))

	for _, name := range []string{"noop", "sdk"} {
		t.Run(name, func(t *testing.T) {
			var (
				tp0   trace.TracerProvider = nooptrace.NewTracerProvider()
				spans func() []sdktrace.ReadOnlySpan
			)
			if name == "sdk" {
				sdk, rec := newTracerProvider()
				tp0, spans = sdk, rec.Ended
			}
			mw := telemetry.NewTracing(telemetry.WithTracerProvider(tp0),
				telemetry.WithPropagator(propagation.TraceContext{}),
				telemetry.WithTopicFunc(func(*message.Message) string { return "t" }))
			var seen trace.SpanContext
			h := mw(func(msg *message.Message) ([]*message.Message, error) {
				span := trace.SpanFromContext(msg.Context())
				seen = span.SpanContext()
				if spans == nil {
					// The producer's span as the handler finds it:
					// not recording, its calls do nothing.
					span.SetAttributes(attribute.String("k", "v"))
					span.AddEvent("e")
					span.SetStatus(codes.Error, "x")
					span.End()
					if span.IsRecording() || span.TracerProvider() == nil {
						t.Errorf("producer's span in the handler's context: recording %t, provider %v",
							span.IsRecording(), span.TracerProvider())
					}
				}
				return nil, nil
			})
			msg := message.NewMessage("m", nil)
			msg.Metadata.Set("traceparent", tp)
			if _, err := h(msg); err != nil {
				t.Fatal(err)
			}
			if spans == nil {
				if !seen.Equal(want) || !seen.IsRemote() {
					t.Fatalf("handler saw %v (remote %t), want the producer's %v", seen, seen.IsRemote(), want)
				}
				return
			}
			ended := spans()
			if len(ended) != 1 {
				t.Fatalf("%d spans ended, want 1", len(ended))
			}
			s := ended[0]
			if !s.Parent().Equal(want) || !s.Parent().IsRemote() {
				t.Fatalf("consumer span's parent = %v, want the producer's %v", s.Parent(), want)
			}
			if !seen.Equal(s.SpanContext()) {
				t.Fatalf("handler saw %v, want the consumer span %v", seen, s.SpanContext())
			}
		})
	}
}

// With the no-op tracer the publisher starts no span but still injects the
// span context the message's context carries.
func TestTracingPublisherNoopTracerInjects(t *testing.T) {
	sdk, _ := newTracerProvider()
	ctx, span := sdk.Tracer("test").Start(context.Background(), "parent")
	defer span.End()
	var rec recorder
	pub := telemetry.NewTracingPublisher(&rec, telemetry.WithTracerProvider(nooptrace.NewTracerProvider()),
		telemetry.WithPropagator(propagation.TraceContext{}))
	withSpan := message.NewMessage("a", nil)
	withSpan.SetContext(ctx)
	plain := message.NewMessage("b", nil)
	if err := pub.Publish("t", withSpan, plain); err != nil {
		t.Fatal(err)
	}
	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier(withSpan.Metadata)))
	if !got.Equal(span.SpanContext().WithRemote(true)) {
		t.Fatalf("injected %v, want the context's span %v", got, span.SpanContext())
	}
	if v := plain.Metadata.Get("traceparent"); v != "" {
		t.Fatalf("message without a span got traceparent %q", v)
	}
}

// The consumer span gets the admission's attributes as it ends; an
// admission recorded while another span is current (a stage of the
// application's own) still goes onto that span at once. A Metrics with a
// no-op meter provider records them all the same.
func TestRecordAdmissionOnOwnAndOtherSpans(t *testing.T) {
	sdk, rec := newTracerProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(noopmetric.NewMeterProvider()))
	if err != nil {
		t.Fatal(err)
	}
	mw := telemetry.NewTracing(telemetry.WithTracerProvider(sdk),
		telemetry.WithTopicFunc(func(*message.Message) string { return "t" }))
	adm := middleware.Admission{Result: middleware.Admitted, Granted: 7, Wait: time.Millisecond,
		Charge: cost.Charge{Vertices: 7, Source: cost.SourceHeader}}
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		if msg.UUID == "inner" {
			ctx, span := sdk.Tracer("app").Start(msg.Context(), "inner stage")
			msg.SetContext(ctx)
			m.OnAdmission(msg, adm)
			span.End()
			return nil, nil
		}
		m.OnAdmission(msg, adm)
		return nil, nil
	})
	for _, id := range []string{"own", "inner"} {
		if _, err := h(message.NewMessage(id, nil)); err != nil {
			t.Fatal(err)
		}
	}
	own := attrMap(spanByMessage(t, rec.Ended(), "process t", "own").Attributes())
	if own["spillway.vertices.granted"] != int64(7) || own["spillway.admission.outcome"] != "admitted" ||
		own["spillway.outcome"] != "handled" {
		t.Fatalf("consumer span attributes = %v", own)
	}
	for _, s := range rec.Ended() {
		if s.Name() != "inner stage" {
			continue
		}
		a := attrMap(s.Attributes())
		if a["spillway.vertices.granted"] != int64(7) {
			t.Fatalf("inner stage span attributes = %v, want the admission", a)
		}
		return
	}
	t.Fatal("no inner stage span")
}

// With OpenTelemetry's global propagator the tracing middleware extracts
// nothing while no propagator is installed, and extracts with the one the
// application installs later. The global propagator is
// process-wide, so the test runs in a process of its own.
func TestTracingGlobalPropagatorInstalledLater(t *testing.T) {
	const env = "SPILLWAY_TEST_GLOBAL_PROPAGATOR"
	if os.Getenv(env) != "1" {
		runInOwnProcess(t, "TestTracingGlobalPropagatorInstalledLater", env)
		return
	}
	want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": traceparent}))
	mw := telemetry.NewTracing(telemetry.WithTracerProvider(nooptrace.NewTracerProvider()))
	seen := func() trace.SpanContext {
		var sc trace.SpanContext
		h := mw(func(msg *message.Message) ([]*message.Message, error) {
			sc = trace.SpanContextFromContext(msg.Context())
			return nil, nil
		})
		msg := message.NewMessage("m", nil)
		msg.Metadata.Set("traceparent", traceparent)
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
		return sc
	}
	if sc := seen(); sc.IsValid() {
		t.Fatalf("extracted %v with no propagator installed", sc)
	}
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if sc := seen(); !sc.Equal(want) {
		t.Fatalf("with TraceContext installed the handler saw %v, want the producer's %v", sc, want)
	}
}
