package telemetry

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// A tracing middleware that starts no span gives the layers below a
// context with what its parent holds (values, the parent's span, an outer
// metrics middleware's record), or the producer's span context from
// traceparent; a metrics middleware that measures inside it adds its
// record.
func TestQuietContext(t *testing.T) {
	const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	producer := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": traceparent}))
	parentSC := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true})
	type valueKey struct{}
	base := context.WithValue(context.Background(), valueKey{}, "v")

	// quietTracing is a tracing middleware that starts no span.
	quietTracing := func(opts ...Option) message.HandlerMiddleware {
		return NewTracing(append([]Option{WithTracerProvider(tracenoop.NewTracerProvider()),
			WithPropagator(propagation.TraceContext{})}, opts...)...)
	}
	// measuring is a metrics middleware whose meter measures.
	measuring := func(t *testing.T) message.HandlerMiddleware {
		t.Helper()
		mp := sdkmetric.NewMeterProvider()
		t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		m, err := NewMetrics(WithMeterProvider(mp))
		if err != nil {
			t.Fatal(err)
		}
		return m.Middleware
	}
	// run passes a message with ctx (and traceparent, when set) through
	// mws, outermost first, and returns the context the handler got.
	run := func(t *testing.T, ctx context.Context, tp string, mws ...message.HandlerMiddleware) context.Context {
		t.Helper()
		var got context.Context
		h := message.HandlerFunc(func(msg *message.Message) ([]*message.Message, error) {
			got = msg.Context()
			return nil, nil
		})
		for i := len(mws) - 1; i >= 0; i-- {
			h = mws[i](h)
		}
		msg := message.NewMessage("m", nil)
		msg.SetContext(ctx)
		if tp != "" {
			msg.Metadata.Set("traceparent", tp)
		}
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
		return got
	}

	t.Run("traceparent", func(t *testing.T) {
		ctx := run(t, trace.ContextWithRemoteSpanContext(base, parentSC), traceparent, quietTracing())
		if sc := trace.SpanContextFromContext(ctx); !sc.Equal(producer) {
			t.Errorf("span context %v, want the producer's %v", sc, producer)
		}
		if ctx.Value(valueKey{}) != "v" || recordFrom(ctx) != nil {
			t.Errorf("value %v, record %v; want v, none", ctx.Value(valueKey{}), recordFrom(ctx))
		}
	})
	t.Run("parent-span", func(t *testing.T) {
		ctx := run(t, trace.ContextWithRemoteSpanContext(base, parentSC), "", quietTracing())
		if sc := trace.SpanContextFromContext(ctx); !sc.Equal(parentSC) {
			t.Errorf("span context %v, want the parent's %v", sc, parentSC)
		}
	})
	t.Run("no-span", func(t *testing.T) {
		ctx := run(t, base, "", quietTracing())
		if trace.SpanContextFromContext(ctx).IsValid() || ctx.Value(valueKey{}) != "v" {
			t.Errorf("span %v, value %v; want none, v",
				trace.SpanContextFromContext(ctx), ctx.Value(valueKey{}))
		}
	})
	t.Run("outer-record", func(t *testing.T) {
		ctx := run(t, base, traceparent, measuring(t), quietTracing())
		if recordFrom(ctx) == nil {
			t.Error("the outer metrics middleware's record is hidden")
		}
	})
	t.Run("inner-record", func(t *testing.T) {
		got := run(t, base, "", quietTracing(), measuring(t))
		if recordFrom(got) == nil {
			t.Error("no record below a measuring metrics middleware")
		}
	})
}

// countingContext counts the lookups of the record's key.
type countingContext struct {
	context.Context
	recordLookups int
}

func (c *countingContext) Value(key any) any {
	if _, ok := key.(recordKey); ok {
		c.recordLookups++
	}
	return c.Context.Value(key)
}

// Until the process has made a record, the quiet path does not look for
// one; each place that makes a record says so, and a record is then found
// where it is, whichever layer made it.
func TestRecordsMade(t *testing.T) {
	t.Cleanup(func() { recordsMade.Store(true) }) // never wrong
	quietTracing := NewTracing(WithTracerProvider(tracenoop.NewTracerProvider()), WithPropagator(propagation.TraceContext{}))
	run := func(ctx context.Context, h message.HandlerFunc, mws ...message.HandlerMiddleware) {
		t.Helper()
		for i := len(mws) - 1; i >= 0; i-- {
			h = mws[i](h)
		}
		msg := message.NewMessage("m", nil)
		msg.SetContext(ctx)
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
	}
	var got *record
	keep := func(msg *message.Message) ([]*message.Message, error) {
		got = recordFrom(msg.Context())
		return nil, nil
	}

	recordsMade.Store(false)
	ctx := &countingContext{Context: context.Background()}
	run(ctx, keep, quietTracing)
	if ctx.recordLookups != 0 || got != nil {
		t.Errorf("before any record: %d record lookups, record %v; want 0, none", ctx.recordLookups, got)
	}

	t.Run("metrics", func(t *testing.T) {
		recordsMade.Store(false)
		mp := sdkmetric.NewMeterProvider()
		defer func() { _ = mp.Shutdown(context.Background()) }()
		m, err := NewMetrics(WithMeterProvider(mp))
		if err != nil {
			t.Fatal(err)
		}
		got = nil
		run(context.Background(), keep, m.Middleware, quietTracing)
		if got == nil {
			t.Error("the outer metrics middleware's record is not found below a quiet tracing middleware")
		}
	})
	t.Run("tracing", func(t *testing.T) {
		recordsMade.Store(false)
		tp := sdktrace.NewTracerProvider()
		defer func() { _ = tp.Shutdown(context.Background()) }()
		got = nil
		run(context.Background(), keep, NewTracing(WithTracerProvider(tp)))
		if got == nil {
			t.Error("the tracing middleware's record is not found below it")
		}
	})
}
