package telemetry_test

import (
	"context"
	"fmt"
	"sort"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/telemetry"
)

// A message published through a TracingPublisher and consumed behind the
// Tracing middleware yields a consumer span whose parent is the producer
// span, in the trace of the request that published it. The budget's
// admission hook annotates the consumer span.
func Example() {
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	opts := []telemetry.Option{
		telemetry.WithTracerProvider(tp),
		telemetry.WithPropagator(propagation.TraceContext{}),
		telemetry.WithMessagingSystem("gochannel"),
	}

	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	router, _ := message.NewRouter(message.RouterConfig{}, logger)
	budget, err := middleware.NewVertexBudget(10_000)
	if err != nil {
		panic(err)
	}
	metrics, err := telemetry.NewMetrics(opts...) // the global meter provider here
	if err != nil {
		panic(err)
	}
	admission, _ := middleware.New(budget, middleware.WithOnAdmission(metrics.OnAdmission))
	// Tracing is the outermost middleware.
	router.AddMiddleware(telemetry.NewTracing(opts...), admission.Middleware)
	done := make(chan struct{})
	router.AddConsumerHandler("parcels", "parcels", pubSub, func(msg *message.Message) error {
		close(done)
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	// Producer side: trace context is injected, the count stamped.
	publisher := telemetry.NewTracingPublisher(cost.NewStampingPublisher(pubSub), opts...)
	ctx, request := tp.Tracer("example").Start(context.Background(), "request")
	msg := message.NewMessage("parcel-1", []byte(`{"type":"Point","coordinates":[1,2]}`))
	msg.SetContext(ctx)
	_ = publisher.Publish("parcels", msg)
	request.End()

	<-done
	_ = router.Close()

	spans := recorder.Ended()
	names := map[trace.SpanID]string{}
	for _, s := range spans {
		names[s.SpanContext().SpanID()] = s.Name()
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].StartTime().Before(spans[j].StartTime()) })
	for _, s := range spans {
		parent := names[s.Parent().SpanID()]
		if parent == "" {
			parent = "-"
		}
		fmt.Printf("%-16s kind=%-8s parent=%-12s same trace=%v\n", s.Name(), s.SpanKind(), parent,
			s.SpanContext().TraceID() == request.SpanContext().TraceID())
	}
	attrs := map[string]string{}
	for _, kv := range spans[2].Attributes() {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	for _, k := range []string{"messaging.destination.name", "spillway.vertices", "spillway.outcome"} {
		fmt.Printf("%s=%s\n", k, attrs[k])
	}
	// Output:
	// request          kind=internal parent=-            same trace=true
	// send parcels     kind=producer parent=request      same trace=true
	// process parcels  kind=consumer parent=send parcels same trace=true
	// messaging.destination.name=parcels
	// spillway.vertices=1
	// spillway.outcome=handled
}
