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

	"github.com/spillway-go/spillway/internal/telhint"
)

// A tracing middleware that starts no span gives the layers below a
// context that answers the record and span lookups itself, with what its
// parent holds or the producer's span context from traceparent, and passes
// every other lookup on. It tells the router it is quiet exactly when the
// message has no record and no recording span; a metrics middleware that
// measures inside it hides it behind the record it makes.
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
	quiet := func(ctx context.Context) bool {
		q, ok := ctx.(*quietContext)
		return ok && q.TelemetryQuiet()
	}

	t.Run("traceparent", func(t *testing.T) {
		ctx := run(t, trace.ContextWithRemoteSpanContext(base, parentSC), traceparent, quietTracing())
		if sc := trace.SpanContextFromContext(ctx); !sc.Equal(producer) {
			t.Errorf("span context %v, want the producer's %v", sc, producer)
		}
		if ctx.Value(valueKey{}) != "v" || recordFrom(ctx) != nil || !quiet(ctx) {
			t.Errorf("value %v, record %v, quiet %t; want v, none, quiet", ctx.Value(valueKey{}), recordFrom(ctx), quiet(ctx))
		}
	})
	t.Run("parent-span", func(t *testing.T) {
		ctx := run(t, trace.ContextWithRemoteSpanContext(base, parentSC), "", quietTracing())
		if sc := trace.SpanContextFromContext(ctx); !sc.Equal(parentSC) {
			t.Errorf("span context %v, want the parent's %v", sc, parentSC)
		}
		if !quiet(ctx) {
			t.Error("not quiet")
		}
	})
	t.Run("no-span", func(t *testing.T) {
		ctx := run(t, base, "", quietTracing())
		if trace.SpanContextFromContext(ctx).IsValid() || ctx.Value(valueKey{}) != "v" || !quiet(ctx) {
			t.Errorf("span %v, value %v, quiet %t; want none, v, quiet",
				trace.SpanContextFromContext(ctx), ctx.Value(valueKey{}), quiet(ctx))
		}
	})
	t.Run("outer-record", func(t *testing.T) {
		ctx := run(t, base, traceparent, measuring(t), quietTracing())
		if recordFrom(ctx) == nil || quiet(ctx) {
			t.Errorf("record %v, quiet %t: the outer metrics middleware's record is hidden", recordFrom(ctx), quiet(ctx))
		}
	})
	t.Run("outermost", func(t *testing.T) {
		// Told it is the outermost telemetry layer (the router's), the
		// middleware does not look for a record: a record there would
		// be hidden, which is why only the router says so.
		got := run(t, base, "", measuring(t), quietTracing(telhint.Outermost().(Option)))
		if recordFrom(got) != nil || !quiet(got) {
			t.Errorf("record %v, quiet %t: the record was looked for", recordFrom(got), quiet(got))
		}
	})
	t.Run("recording-span", func(t *testing.T) {
		tp := sdktrace.NewTracerProvider()
		defer func() { _ = tp.Shutdown(context.Background()) }()
		parent, span := tp.Tracer("t").Start(base, "parent")
		defer span.End()
		c := &quietContext{Context: parent}
		c.resolve(false)
		if trace.SpanFromContext(c) != span || c.TelemetryQuiet() {
			t.Errorf("span %v, quiet %t; want the parent's recording span, not quiet", trace.SpanFromContext(c), c.TelemetryQuiet())
		}
	})
	t.Run("inner-record", func(t *testing.T) {
		got := run(t, base, "", quietTracing(), measuring(t))
		if recordFrom(got) == nil || quiet(got) {
			t.Errorf("record %v, quiet %t: a measuring metrics middleware must hide the quiet context", recordFrom(got), quiet(got))
		}
	})
}

// markerContext stands for the router's context, which the tracing
// middleware may mark quiet (telhint.QuietMarker).
type markerContext struct {
	context.Context
	marked bool
}

func (c *markerContext) MarkTelemetryQuiet() { c.marked = true }

// On the quiet path with the no-op tracer, the parent's span is looked up
// in the message's context once: deciding that no span is started and
// answering the layers below share the lookup, which on Kafka walks a
// dozen values.
func TestQuietLooksUpTheSpanOnce(t *testing.T) {
	outermost := telhint.Outermost().(Option)
	for _, c := range []struct {
		name string
		opts []Option
		want int // lookups that reach the message's context
	}{
		{"hand-composed", nil, 1},
		{"router", []Option{outermost}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := &countingContext{markerContext: markerContext{Context: context.Background()}}
			h := NewTracing(append([]Option{WithTracerProvider(tracenoop.NewTracerProvider()),
				WithPropagator(propagation.TraceContext{})}, c.opts...)...)(
				func(msg *message.Message) ([]*message.Message, error) {
					// What the admission hook asks, below.
					if trace.SpanFromContext(msg.Context()).IsRecording() {
						t.Error("a recording span appeared")
					}
					return nil, nil
				})
			msg := message.NewMessage("m", nil)
			msg.SetContext(ctx)
			if _, err := h(msg); err != nil {
				t.Fatal(err)
			}
			if ctx.spanLookups != c.want {
				t.Errorf("the span key was looked up %d times in the message's context, want %d", ctx.spanLookups, c.want)
			}
		})
	}
}

// countingContext counts the lookups of OpenTelemetry's span key and of
// the record's.
type countingContext struct {
	markerContext
	spanLookups, recordLookups int
}

func (c *countingContext) Value(key any) any {
	if key == spanKey() {
		c.spanLookups++
	}
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
	ctx := &countingContext{markerContext: markerContext{Context: context.Background()}}
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
