package telemetry_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-go/spillway/telemetry"
)

// With WithLinkToProducer the consumer span of a message that carries an
// (untrusted) producer's traceparent starts a trace of its own and links to
// the producer's span, instead of joining the producer's trace; without it,
// the producer's span is the parent (issue 13, item 13).
func TestEdgeLinkToUntrustedProducer(t *testing.T) {
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0xab}, SpanID: trace.SpanID{0xcd}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	for _, link := range []bool{false, true} {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		mw := telemetry.NewTracing(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(prop),
			telemetry.WithLinkToProducer(link), telemetry.WithTopicFunc(func(*message.Message) string { return "in" }))

		msg := message.NewMessage("m", nil)
		member, _ := baggage.NewMember("tenant", "forged")
		bag, _ := baggage.New(member)
		prop.Inject(baggage.ContextWithBaggage(trace.ContextWithRemoteSpanContext(context.Background(), remote), bag),
			propagation.MapCarrier(msg.Metadata))
		var sawBaggage string
		if _, err := mw(func(m *message.Message) ([]*message.Message, error) {
			sawBaggage = baggage.FromContext(m.Context()).Member("tenant").Value()
			return nil, nil
		})(msg); err != nil {
			t.Fatal(err)
		}
		spans := rec.Ended()
		if len(spans) != 1 {
			t.Fatalf("link %t: %d spans, want 1", link, len(spans))
		}
		s := spans[0]
		if !link {
			if !s.Parent().Equal(remote) || s.SpanContext().TraceID() != remote.TraceID() || sawBaggage != "forged" {
				t.Errorf("parent mode: parent %v, trace %s, baggage %q; want the producer's", s.Parent(), s.SpanContext().TraceID(), sawBaggage)
			}
			continue
		}
		if s.Parent().IsValid() || s.SpanContext().TraceID() == remote.TraceID() {
			t.Errorf("link mode: parent %v, trace %s; want a new root", s.Parent(), s.SpanContext().TraceID())
		}
		if l := s.Links(); len(l) != 1 || !l[0].SpanContext.Equal(remote) {
			t.Errorf("link mode: links %v, want one to the producer's span", l)
		}
		if sawBaggage != "" {
			t.Errorf("link mode: handler saw the producer's baggage %q", sawBaggage)
		}
	}
}
