package telemetry_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/telemetry"
)

// benchStack describes one configuration of the consumer (and producer)
// stack measured by BenchmarkStack.
type benchStack struct {
	name      string
	budget    bool
	telemetry bool
	tp        func() trace.TracerProvider
	mp        func() metric.MeterProvider
	// oneSpan: no Spillway middleware, only one SDK span per message
	// started and ended around the handler (the floor for any stack
	// that traces each message).
	oneSpan bool
	// twoSpans: as oneSpan, plus a producer span around each publish
	// whose context travels in the metadata (W3C traceparent), so the
	// consumer span is its child: the floor for a stack that traces both
	// ends, as stack=budget+otel-sdk does.
	twoSpans bool
	// plainPublisher: the messages are published without
	// TracingPublisher, so only the consumer's side is traced.
	plainPublisher bool
	// attrs: as oneSpan, with as many attributes as Spillway's consumer
	// span carries for these messages: four at the start (a start option
	// built once) and nine as it ends (from a buffer reused across
	// messages), so that what the SDK does with attributes is in the
	// floor too.
	attrs bool
	// window, if set, bounds the messages published and not yet handled
	// (BenchmarkStackWindowed).
	window int
}

func sdkProviders() (func() trace.TracerProvider, func() metric.MeterProvider) {
	return func() trace.TracerProvider {
			// Every span sampled and handed to an exporter that drops it,
			// synchronously (SimpleSpanProcessor: one export call under a
			// lock per span, documented as not meant for production).
			return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(
				sdktrace.NewSimpleSpanProcessor(tracetest.NewNoopExporter())))
		}, func() metric.MeterProvider {
			mp, _ := newMeterProvider()
			return mp
		}
}

// batchTracerProvider samples every span and exports it to an exporter
// that drops it through the batch span processor, as a production setup
// would; WithBlocking makes the processor wait for room in its queue
// rather than drop spans, so every span is exported.
func batchTracerProvider() trace.TracerProvider {
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter(), sdktrace.WithBlocking()))
}

// ratioTracerProvider samples one trace in ten, at the producer (the
// consumer follows the producer's decision, which the message carries),
// through the batch span processor: the sampling production setups use.
func ratioTracerProvider() trace.TracerProvider {
	return sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1))),
		sdktrace.WithBatcher(tracetest.NewNoopExporter(), sdktrace.WithBlocking()))
}

// shutdown stops what a provider runs (the batch processor's goroutine).
func shutdown(p any) {
	if s, ok := p.(interface{ Shutdown(context.Context) error }); ok {
		_ = s.Shutdown(context.Background())
	}
}

// BenchmarkStack measures end-to-end throughput of a Watermill router over
// GoChannel: publish b.N messages, wait until all are handled.
//
//	handler=empty          does nothing: the stack's own cost is all there
//	                       is to measure (the worst case for the ratio)
//	handler=decode         decodes the GeoJSON payload (cost.Decode), the
//	                       least any Spillway handler does
//
//	stack=bare             router + handler
//	stack=budget           + middleware.Admitter
//	stack=budget+otel-noop + Tracing, Metrics, OnAdmission, TracingPublisher
//	                         with no-op tracer and meter providers
//	stack=budget+otel-sdk  the same with the SDK: every span sampled and
//	                         exported to a no-op exporter through
//	                         SimpleSpanProcessor (synchronously), metrics
//	                         aggregated by a manual reader
//	stack=budget+otel-sdk-batch  the same through the batch span processor
//	                         (blocking when its queue is full: no span
//	                         dropped), the processor production uses
//	stack=budget+otel-sdk-ratio  the batch processor with one trace in ten
//	                         sampled at the producer, the consumer
//	                         following the producer's decision
//	stack=budget+otel-sdk-consumer  stack=budget+otel-sdk without
//	                         TracingPublisher: the consumer's side alone
//	                         (one span per message, no trace context in
//	                         the message to continue)
//	stack=bare+one-sdk-span  no Spillway code: one SDK span per message,
//	                         no attributes, as stack=budget+otel-sdk
//	                         exports it; what tracing each message costs
//	                         at the least
//	stack=bare+two-sdk-spans  no Spillway code: a producer span per
//	                         publish, injected into the metadata, and a
//	                         consumer span continuing it, no attributes;
//	                         the least that tracing both ends costs
func BenchmarkStack(b *testing.B) {
	sdkTP, sdkMP := sdkProviders()
	for _, s := range []benchStack{
		{name: "bare"},
		{name: "budget", budget: true},
		{name: "budget+otel-noop", budget: true, telemetry: true,
			tp: func() trace.TracerProvider { return nooptrace.NewTracerProvider() },
			mp: func() metric.MeterProvider { return noopmetric.NewMeterProvider() }},
		{name: "budget+otel-sdk", budget: true, telemetry: true, tp: sdkTP, mp: sdkMP},
		{name: "budget+otel-sdk-batch", budget: true, telemetry: true, tp: batchTracerProvider, mp: sdkMP},
		{name: "budget+otel-sdk-ratio", budget: true, telemetry: true, tp: ratioTracerProvider, mp: sdkMP},
		{name: "budget+otel-sdk-consumer", budget: true, telemetry: true, tp: sdkTP, mp: sdkMP, plainPublisher: true},
		{name: "bare+one-sdk-span", oneSpan: true, tp: sdkTP},
		{name: "bare+two-sdk-spans", oneSpan: true, twoSpans: true, tp: sdkTP},
		{name: "bare+one-sdk-span-attrs", oneSpan: true, attrs: true, tp: sdkTP},
	} {
		for _, h := range []string{"empty", "decode"} {
			b.Run("handler="+h+"/stack="+s.name, func(b *testing.B) { runStack(b, s, h == "decode") })
		}
	}
}

// BenchmarkStackWindowed is BenchmarkStack's empty handler with the
// publisher held to window messages published and not yet handled, as a
// broker's prefetch holds a consumer: BenchmarkStack's publisher runs
// ahead of the router, and GoChannel parks two goroutines for every
// message it has delivered and the handler has not acknowledged, so the
// slower a stack is, the more goroutines the collector scans for each
// message, and the benchmark magnifies a stack's cost (tens of
// microseconds for an SDK span that costs one or two). Here the backlog
// is the same for every stack.
func BenchmarkStackWindowed(b *testing.B) {
	sdkTP, sdkMP := sdkProviders()
	noopTP := func() trace.TracerProvider { return nooptrace.NewTracerProvider() }
	noopMP := func() metric.MeterProvider { return noopmetric.NewMeterProvider() }
	for _, window := range []int{64, 1024} {
		for _, s := range []benchStack{
			{name: "bare"},
			{name: "budget", budget: true},
			{name: "budget+otel-noop", budget: true, telemetry: true, tp: noopTP, mp: noopMP},
			{name: "budget+otel-sdk", budget: true, telemetry: true, tp: sdkTP, mp: sdkMP},
			{name: "budget+otel-sdk-batch", budget: true, telemetry: true, tp: batchTracerProvider, mp: sdkMP},
			{name: "budget+otel-sdk-ratio", budget: true, telemetry: true, tp: ratioTracerProvider, mp: sdkMP},
			{name: "bare+one-sdk-span", oneSpan: true, tp: sdkTP},
			{name: "bare+two-sdk-spans", oneSpan: true, twoSpans: true, tp: sdkTP},
		} {
			s.window = window
			b.Run("window="+strconv.Itoa(window)+"/stack="+s.name, func(b *testing.B) { runStack(b, s, false) })
		}
	}
}

func runStack(b *testing.B, s benchStack, decode bool) {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 4096}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		b.Fatal(err)
	}
	var pub message.Publisher = pubSub
	var onAdmission func(*message.Message, middleware.Admission)
	if s.telemetry {
		tp := s.tp()
		defer shutdown(tp)
		opts := []telemetry.Option{
			telemetry.WithTracerProvider(tp), telemetry.WithMeterProvider(s.mp()),
			telemetry.WithPropagator(propagation.TraceContext{}), telemetry.WithMessagingSystem("gochannel"),
		}
		metrics, err := telemetry.NewMetrics(opts...)
		if err != nil {
			b.Fatal(err)
		}
		router.AddMiddleware(telemetry.NewTracing(opts...), metrics.Middleware)
		onAdmission = metrics.OnAdmission
		if !s.plainPublisher {
			pub = telemetry.NewTracingPublisher(pubSub, opts...)
		}
	}
	if s.oneSpan {
		tp := s.tp()
		defer shutdown(tp)
		tracer := tp.Tracer("bench")
		var prop propagation.TraceContext
		var startOpts []trace.SpanStartOption
		var endAttrs sync.Pool
		if s.attrs {
			startOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
				attribute.String("messaging.system", "gochannel"), attribute.String("messaging.operation.type", "process"),
				attribute.String("messaging.operation.name", "process"), attribute.String("messaging.destination.name", "bench"))}
		}
		router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				ctx := msg.Context()
				if s.twoSpans {
					ctx = prop.Extract(ctx, propagation.MapCarrier(msg.Metadata))
				}
				_, span := tracer.Start(ctx, "handle", startOpts...)
				defer span.End()
				if s.attrs {
					buf, _ := endAttrs.Get().(*[]attribute.KeyValue)
					if buf == nil {
						buf = new([]attribute.KeyValue)
					}
					*buf = append((*buf)[:0],
						attribute.String("messaging.message.id", msg.UUID), attribute.Int("messaging.message.body.size", len(msg.Payload)),
						attribute.Int64("spillway.vertices", 1), attribute.String("spillway.cost.source", "header"),
						attribute.String("spillway.admission", "admitted"), attribute.Float64("spillway.admission.wait", 0),
						attribute.Int64("spillway.vertices.granted", 1), attribute.Bool("spillway.vertices.clamped", false),
						attribute.String("spillway.outcome", "handled"))
					defer func() {
						span.SetAttributes(*buf...)
						endAttrs.Put(buf)
					}()
				}
				return h(msg)
			}
		})
		if s.twoSpans {
			pub = spanPublisher{Publisher: pubSub, tracer: tracer}
		}
	}
	if s.budget {
		admission, err := middleware.New(mustVertexBudget(1<<40), middleware.WithOnAdmission(onAdmission))
		if err != nil {
			b.Fatal(err)
		}
		router.AddMiddleware(admission.Middleware)
	}
	var handled atomic.Int64
	done := make(chan struct{})
	target := int64(b.N)
	var window chan struct{} // a token per message published and not handled
	if s.window > 0 {
		window = make(chan struct{}, s.window)
	}
	router.AddConsumerHandler("bench", "bench", pubSub, func(msg *message.Message) error {
		if decode {
			if _, err := cost.Decode(msg.Payload); err != nil {
				return err
			}
		}
		if window != nil {
			<-window
		}
		if handled.Add(1) == target {
			close(done)
		}
		return nil
	})
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	<-router.Running()

	payload := []byte(`{"type":"Point","coordinates":[1,2]}`)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	start := time.Now()
	for i := range b.N {
		m := message.NewMessage(strconv.Itoa(i), payload)
		m.Metadata.Set("vertex_count", "1")
		if window != nil {
			window <- struct{}{}
		}
		if err := pub.Publish("bench", m); err != nil {
			b.Fatal(err)
		}
	}
	<-done
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	// CPU time of the whole process per message: unlike msgs/s it does not
	// depend on what else the (shared) machine runs.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/msg")
	_ = router.Close()
	<-runErr
	_ = pubSub.Close()
}

// spanPublisher starts a producer span around each publish and injects
// its context into the message's metadata: no attributes, nothing else.
type spanPublisher struct {
	message.Publisher
	tracer trace.Tracer
}

func (p spanPublisher) Publish(topic string, msgs ...*message.Message) error {
	var prop propagation.TraceContext
	for _, m := range msgs {
		ctx, span := p.tracer.Start(m.Context(), "send", trace.WithSpanKind(trace.SpanKindProducer))
		prop.Inject(ctx, propagation.MapCarrier(m.Metadata))
		err := p.Publisher.Publish(topic, m)
		span.End()
		if err != nil {
			return err
		}
	}
	return nil
}

// processCPU returns the user and system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMiddlewareChain isolates the per-message cost of the telemetry
// middlewares: the chain called directly, as the router would call it, on
// a message that carries a traceparent. The -plain rows' message carries
// none, in a context five values deep, as Watermill's router gives each
// message (handler, publisher and subscriber names, topics).
func BenchmarkMiddlewareChain(b *testing.B) {
	handler := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	sdkTP, sdkMP := sdkProviders()
	for _, c := range []struct {
		name  string
		tp    func() trace.TracerProvider
		mp    func() metric.MeterProvider
		plain bool
	}{
		{"budget", nil, nil, false},
		{"budget+otel-noop", func() trace.TracerProvider { return nooptrace.NewTracerProvider() },
			func() metric.MeterProvider { return noopmetric.NewMeterProvider() }, false},
		{"budget+otel-noop-plain", func() trace.TracerProvider { return nooptrace.NewTracerProvider() },
			func() metric.MeterProvider { return noopmetric.NewMeterProvider() }, true},
		{"budget+otel-sdk", sdkTP, sdkMP, false},
		{"budget+otel-sdk-batch", batchTracerProvider, sdkMP, false},
	} {
		b.Run("stack="+c.name, func(b *testing.B) {
			var mopts []middleware.Option
			var wrap []message.HandlerMiddleware
			if c.tp != nil {
				tp := c.tp()
				defer shutdown(tp)
				opts := []telemetry.Option{telemetry.WithTracerProvider(tp), telemetry.WithMeterProvider(c.mp()),
					telemetry.WithPropagator(propagation.TraceContext{}),
					telemetry.WithTopicFunc(func(*message.Message) string { return "bench" })}
				metrics, err := telemetry.NewMetrics(opts...)
				if err != nil {
					b.Fatal(err)
				}
				mopts = append(mopts, middleware.WithOnAdmission(metrics.OnAdmission))
				wrap = append(wrap, telemetry.NewTracing(opts...), metrics.Middleware)
			}
			admission, err := middleware.New(mustVertexBudget(1<<40), mopts...)
			if err != nil {
				b.Fatal(err)
			}
			h := admission.Middleware(handler)
			for i := len(wrap) - 1; i >= 0; i-- {
				h = wrap[i](h)
			}
			msg := message.NewMessage("id", []byte("payload"))
			msg.Metadata.Set("vertex_count", "1234")
			base := context.Background()
			if c.plain {
				for _, k := range []string{"handler", "publisher", "subscriber", "subscribe_topic", "publish_topic"} {
					base = context.WithValue(base, benchKey(k), k)
				}
			} else {
				msg.Metadata.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
			}
			b.ReportAllocs()
			for b.Loop() {
				msg.SetContext(base)
				_, _ = h(msg)
			}
		})
	}
}

// benchKey is a context key of BenchmarkMiddlewareChain's plain message.
type benchKey string
