package router_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/router"
	"github.com/spillway-go/spillway/telemetry"
)

// A router on the memory broker: the same handler code runs on Kafka by
// changing cfg.Broker (or SPILLWAY_BROKER).
func Example() {
	cfg := router.Config{Broker: "memory"}
	cfg.Budget.Vertices = 1000

	r, err := router.New(cfg, nil)
	if err != nil {
		panic(err)
	}

	var mu sync.Mutex
	var wg sync.WaitGroup
	vertices := 0
	wg.Add(3)
	_, err = r.AddConsumerHandler("count", "shapes", func(msg *message.Message) error {
		defer wg.Done()
		n, _ := strconv.Atoi(msg.Metadata.Get("vertex_count"))
		mu.Lock()
		vertices += n
		mu.Unlock()
		return nil
	})
	if err != nil {
		panic(err)
	}

	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()

	for _, payload := range []string{
		`{"type":"Point","coordinates":[1,2]}`,
		`{"type":"LineString","coordinates":[[0,0],[1,1],[2,0]]}`,
		`{"type":"Polygon","coordinates":[[[0,0],[4,0],[4,4],[0,4],[0,0]]]}`,
	} {
		// The router's publisher stamps vertex_count.
		if err := r.Publisher().Publish("shapes", message.NewMessage(watermill.NewUUID(), []byte(payload))); err != nil {
			panic(err)
		}
	}
	wg.Wait()
	if err := r.Close(); err != nil {
		panic(err)
	}
	st := r.Stats()
	fmt.Println("vertices:", vertices)
	fmt.Println("admitted:", st.Budget.Admitted, "in use after close:", st.Budget.InUse)
	// Output:
	// vertices: 9
	// admitted: 3 in use after close: 0
}

// costLog is a hook: it has the OnAdmission method, so the router calls
// it once the budget has admitted a message.
type costLog struct{ admitted chan<- string }

func (c costLog) OnAdmission(msg *message.Message, a middleware.Admission) {
	c.admitted <- fmt.Sprintf("%s: %s, %d vertices granted", msg.UUID, a.Result, a.Granted)
}

// Hooks watch the stack's events; a value may have several hook methods,
// and each event calls the hooks that have its method in order.
func ExampleWithHooks() {
	cfg := router.Config{Broker: "memory"}
	cfg.Budget.Vertices = 1000
	admitted := make(chan string, 1)
	r, err := router.New(cfg, nil, router.WithHooks(costLog{admitted}))
	if err != nil {
		panic(err)
	}
	if _, err := r.AddConsumerHandler("h", "shapes", func(*message.Message) error { return nil }); err != nil {
		panic(err)
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	line := message.NewMessage("line-1", []byte(`{"type":"LineString","coordinates":[[0,0],[1,1],[2,0]]}`))
	if err := r.Publisher().Publish("shapes", line); err != nil {
		panic(err)
	}
	fmt.Println(<-admitted)
	if err := r.Close(); err != nil {
		panic(err)
	}
	// Output:
	// line-1: admitted, 3 vertices granted
}

// A Watermill router of your own, with its middlewares and plugins: New
// adds Spillway's stack to it in the right order, and handlers are added
// and the router run through Spillway's Router.
func ExampleWithWatermillRouter() {
	wm, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	// A middleware added before New runs outside Spillway's stack, once
	// per delivery.
	wm.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			fmt.Println("received", msg.UUID)
			return h(msg)
		}
	})

	r, err := router.New(router.Config{}, nil, router.WithWatermillRouter(wm))
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	_, err = r.AddConsumerHandler("index", "parcels", func(msg *message.Message) error {
		fmt.Println("indexed", msg.UUID, "with", msg.Metadata.Get("vertex_count"), "vertices")
		close(done)
		return nil
	})
	if err != nil {
		panic(err)
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	payload := []byte(`{"type":"LineString","coordinates":[[0,0],[1,1],[2,0]]}`)
	if err := r.Publisher().Publish("parcels", message.NewMessage("parcel-1", payload)); err != nil {
		panic(err)
	}
	<-done
	if err := r.Close(); err != nil {
		panic(err)
	}
	// Output:
	// received parcel-1
	// indexed parcel-1 with 3 vertices
}

// Providers, the propagator and any other telemetry option reach the
// router through WithTelemetry: here a tracer provider that records the
// spans, and W3C traceparent between producer and consumer.
func ExampleWithTelemetry() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	r, err := router.New(router.Config{}, nil, router.WithTelemetry(
		telemetry.WithTracerProvider(tp),
		telemetry.WithPropagator(propagation.TraceContext{}),
	))
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	if _, err := r.AddConsumerHandler("index", "parcels", func(*message.Message) error {
		close(done)
		return nil
	}); err != nil {
		panic(err)
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	payload := []byte(`{"type":"LineString","coordinates":[[0,0],[1,1],[2,0]]}`)
	if err := r.Publisher().Publish("parcels", message.NewMessage("parcel-1", payload)); err != nil {
		panic(err)
	}
	<-done
	if err := r.Close(); err != nil {
		panic(err)
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	send, process := spans["send parcels"], spans["process parcels"]
	fmt.Println("consumer span is the producer span's child:", process.Parent().SpanID() == send.SpanContext().SpanID())
	// Output:
	// consumer span is the producer span's child: true
}
