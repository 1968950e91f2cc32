package router

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/telemetry"
)

// startRouter runs r and checks Close and Run when the test ends (the
// tests close it earlier, before their leak check; Close is idempotent).
func startRouter(t *testing.T, r *Router) {
	t.Helper()
	errc := runRouter(t, r)
	t.Cleanup(func() { closeRouter(t, r, errc) })
}

// TestRedisMalformedEntryDeadLettered: an entry no Watermill publisher
// wrote (no message UUID) goes to redis.dead_letter_topic without reaching
// the handler or the budget, and the stream keeps flowing. The move is
// counted as dead-lettered, reason malformed.
func TestRedisMalformedEntryDeadLettered(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := redisConfig(t)
	cfg.Redis.DeadLetterTopic = "shapes.malformed"
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	r, err := New(cfg, nil, WithTelemetry(telemetry.WithMeterProvider(mp)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make(chan string, 4)
	if _, err := r.AddConsumerHandler("sink", "shapes", func(msg *message.Message) error {
		got <- msg.UUID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	startRouter(t, r)

	rc := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
	defer rc.Close()
	ctx := context.Background()
	if err := rc.XAdd(ctx, &redis.XAddArgs{Stream: "shapes", Values: []any{"payload", "not a watermill entry"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Publisher().Publish("shapes", message.NewMessage("good", []byte(pingPayload(1)))); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != "good" {
			t.Fatalf("handler got %q", id)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the well-formed message never arrived")
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().DeadLettered < 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := r.Stats().DeadLettered; n != 1 {
		t.Fatalf("dead-lettered %d entries, want 1", n)
	}
	if n, err := rc.XLen(ctx, "shapes.malformed").Result(); err != nil || n != 1 {
		t.Errorf("dead-letter stream holds %d entries (%v), want 1", n, err)
	}
	select {
	case id := <-got:
		t.Errorf("handler also got %q", id)
	default:
	}
	if st := r.Stats().Budget; st.Admitted != 1 {
		t.Errorf("budget admitted %d messages, want 1 (the malformed one must not be charged)", st.Admitted)
	}
	if got := collectCounter(t, reader, "spillway.messages.dead_lettered"); got["shapes/malformed"] != 1 || len(got) != 1 {
		t.Errorf("spillway.messages.dead_lettered = %v, want shapes/malformed: 1", got)
	}
}

// TestTraceThroughRouter: on every broker, a message published through
// the router's publisher with a span in its context is consumed in a span
// whose parent is the producer span, which is the caller's span's child.
func TestTraceThroughRouter(t *testing.T) {
	for _, bc := range brokerCases {
		t.Run(bc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, leakOptions...)
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			defer func() { _ = tp.Shutdown(context.Background()) }()
			cfg := bc.config(t)
			cfg.CloseTimeout = 10 * time.Second
			r, err := New(cfg, nil, WithTelemetry(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(propagation.TraceContext{})))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			done := make(chan struct{})
			if _, err := r.AddConsumerHandler("traced", "shapes", func(*message.Message) error {
				close(done)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			startRouter(t, r)

			ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
			msg := message.NewMessage("m-1", geojsonPayload(t, heavyGeometry(t, 1, 50)))
			msg.SetContext(ctx)
			if err := r.Publisher().Publish("shapes", msg); err != nil {
				t.Fatal(err)
			}
			parent.End()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("message not consumed")
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			var producer, consumer sdktrace.ReadOnlySpan
			for _, s := range rec.Ended() {
				switch s.SpanKind() {
				case trace.SpanKindProducer:
					producer = s
				case trace.SpanKindConsumer:
					consumer = s
				}
			}
			if producer == nil || consumer == nil {
				t.Fatalf("producer %v, consumer %v: want both", producer != nil, consumer != nil)
			}
			if producer.Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("producer span's parent %s, want the caller's span %s", producer.Parent().SpanID(), parent.SpanContext().SpanID())
			}
			if consumer.Parent().SpanID() != producer.SpanContext().SpanID() || consumer.SpanContext().TraceID() != parent.SpanContext().TraceID() {
				t.Errorf("consumer span's parent %s (trace %s), want the producer span %s (trace %s)",
					consumer.Parent().SpanID(), consumer.SpanContext().TraceID(), producer.SpanContext().SpanID(), parent.SpanContext().TraceID())
			}
			want, _ := cost.ParseCount(msg.Metadata.Get(cost.MetadataKey), 0)
			attrs := map[attribute.Key]attribute.Value{}
			for _, kv := range consumer.Attributes() {
				attrs[kv.Key] = kv.Value
			}
			if v, ok := attrs[attribute.Key("spillway.vertices")]; !ok || v.AsInt64() != want {
				t.Errorf("consumer span spillway.vertices = %v, want %d", v.String(), want)
			}
			if v := attrs[attribute.Key("spillway.outcome")]; v.AsString() != "handled" {
				t.Errorf("consumer span outcome %q", v.String())
			}
			if bc.name != "memory" {
				if v := attrs["messaging.consumer.group.name"]; v.AsString() != "spillway.traced" {
					t.Errorf("consumer group attribute %q, want spillway.traced", v.String())
				}
			}
		})
	}
}

// collect returns the int64 gauge points of metric name, by their budget
// or source label.
func collect(t *testing.T, reader sdkmetric.Reader, name string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			g, ok := m.Data.(metricdata.Gauge[int64])
			if !ok {
				t.Fatalf("%s is %T", name, m.Data)
			}
			for _, p := range g.DataPoints {
				label, _ := p.Attributes.Value(attribute.Key("budget"))
				if v, ok := p.Attributes.Value(attribute.Key("topic")); ok {
					label = v
				}
				out[label.AsString()] += p.Value
			}
		}
	}
	return out
}

// TestBudgetMetrics: the router's budget is exported under telemetry.name
// with its configured capacity, and no longer after Close.
func TestBudgetMetrics(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	cfg := Config{}
	cfg.Budget.Vertices = 12_345
	cfg.Telemetry.Name = "geo"
	r, err := New(cfg, nil, WithTelemetry(telemetry.WithMeterProvider(mp)))
	if err != nil {
		t.Fatal(err)
	}
	if got := collect(t, reader, "spillway.budget.capacity"); got["geo"] != 12_345 {
		t.Errorf("spillway.budget.capacity = %v, want geo: 12345", got)
	}
	if got := collect(t, reader, "spillway.budget.in_use"); len(got) != 1 || got["geo"] != 0 {
		t.Errorf("spillway.budget.in_use = %v, want geo: 0", got)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, reader, "spillway.budget.capacity"); len(got) != 0 {
		t.Errorf("budget still exported after Close: %v", got)
	}
}

// TestLagThroughRouter: with N messages published and the handler
// finishing M of them and holding the rest, the router reports a lag of
// N − M, both read now (Lag) and from the background sampler, and exports
// it as spillway.consumer.lag.
func TestLagThroughRouter(t *testing.T) {
	const n, m = 10, 4
	for _, bc := range brokerCases {
		t.Run(bc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, leakOptions...)
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			defer func() { _ = mp.Shutdown(context.Background()) }()
			cfg := bc.config(t)
			cfg.CloseTimeout = 10 * time.Second
			cfg.Kafka.Partitions = 1
			cfg.Telemetry.LagInterval = 100 * time.Millisecond
			r, err := New(cfg, nil, WithTelemetry(telemetry.WithMeterProvider(mp)))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var handled atomic.Int64
			release := make(chan struct{})
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			defer unblock()
			if _, err := r.AddConsumerHandler("lagging", "jobs", func(*message.Message) error {
				if handled.Add(1) > m {
					<-release
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if bc.name == "memory" {
				if _, err := r.Lag(context.Background()); !errors.Is(err, ErrLagUnknown) {
					t.Errorf("memory Lag: %v, want ErrLagUnknown", err)
				}
				if r.lagSampler != nil {
					t.Error("memory has a lag sampler")
				}
				return
			}
			startRouter(t, r)
			for i := range n {
				msg := message.NewMessage("j-"+strconv.Itoa(i), pingPayload(i))
				if bc.name == "kafka-key" {
					// One key, so one at a time in offset order, as a
					// partition is in partition mode: the committed
					// watermark is then the first m.
					msg.Metadata.Set("entity_id", "one-key")
				}
				if err := r.Publisher().Publish("jobs", msg); err != nil {
					t.Fatal(err)
				}
			}
			ctx := context.Background()
			var lag int64 = -1
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				if lag, err = r.Lag(ctx); err == nil && lag == n-m && handled.Load() > m {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if lag != n-m {
				t.Fatalf("Lag = %d (%v) with %d handled, want %d", lag, err, handled.Load(), n-m)
			}
			s := r.lagSampler
			if err := s.Sample(ctx); err != nil {
				t.Fatal(err)
			}
			if got := s.TotalLag(); got != n-m {
				t.Errorf("sampler TotalLag = %d, want %d", got, n-m)
			}
			if got := collect(t, reader, "spillway.consumer.lag"); got["jobs"] != n-m {
				t.Errorf("spillway.consumer.lag = %v, want jobs: %d", got, n-m)
			}
			unblock()
			deadline = time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				if lag, err = r.Lag(ctx); err == nil && lag == 0 {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if lag != 0 {
				t.Errorf("Lag = %d (%v) after release, want 0", lag, err)
			}
		})
	}
}

// TestAdmissionHooksOnLeanStack: on a stack with no optional layer and
// telemetry on (the memory broker), with a meter provider every admission
// is measured, and without one every admission still reaches the hooks of
// WithHooks.
func TestAdmissionHooksOnLeanStack(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	const n = 5
	for _, withMeter := range []bool{true, false} {
		t.Run("meter="+strconv.FormatBool(withMeter), func(t *testing.T) {
			var hooked atomic.Int64
			opts := []Option{WithHooks(admissionFunc(func(_ *message.Message, a middleware.Admission) {
				if a.Result == middleware.Admitted {
					hooked.Add(1)
				}
			}))}
			reader := sdkmetric.NewManualReader()
			if withMeter {
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
				defer func() { _ = mp.Shutdown(context.Background()) }()
				opts = append(opts, WithTelemetry(telemetry.WithMeterProvider(mp)))
			}
			r, err := New(Config{Retry: RetryConfig{Disabled: true}}, nil, opts...) // a lean stack
			if err != nil {
				t.Fatal(err)
			}
			var handled atomic.Int64
			if _, err := r.AddConsumerHandler("h", "lean", func(*message.Message) error {
				handled.Add(1)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			startRouter(t, r)
			for i := range n {
				publishCosted(t, r, "lean", "m"+strconv.Itoa(i), 10)
			}
			waitFor(t, "every message handled", func() bool { return handled.Load() == n })
			if got := hooked.Load(); got != n {
				t.Errorf("the WithHooks admission hook saw %d admissions, want %d", got, n)
			}
			if !withMeter {
				return
			}
			var rm metricdata.ResourceMetrics
			if err := reader.Collect(context.Background(), &rm); err != nil {
				t.Fatal(err)
			}
			var measured uint64
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "spillway.admission.wait" {
						for _, p := range h.DataPoints {
							measured += p.Count
						}
					}
				}
			}
			if measured != n {
				t.Errorf("spillway.admission.wait measured %d admissions, want %d", measured, n)
			}
		})
	}
}

// TestHandlerSeesProducerTrace: with no tracer provider installed the
// router's consumer span does not record, but the handler still finds the
// producer's span context (from traceparent) in its message's context, for
// its own spans and for propagation; a message without one has none.
func TestHandlerSeesProducerTrace(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, withParent := range []bool{false, true} {
		t.Run("traceparent="+strconv.FormatBool(withParent), func(t *testing.T) {
			r, err := New(Config{Broker: brokerMemory, Retry: RetryConfig{Disabled: true}}, nil,
				WithTelemetry(telemetry.WithPropagator(propagation.TraceContext{})))
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan trace.SpanContext, 1)
			if _, err := r.AddConsumerHandler("h", "producer-trace", func(msg *message.Message) error {
				got <- trace.SpanContextFromContext(msg.Context())
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			startRouter(t, r)
			var meta []string
			if withParent {
				meta = []string{"traceparent", traceparent}
			}
			publishCosted(t, r, "producer-trace", "m1", 10, meta...)
			sc := <-got
			if withParent && sc.TraceID().String() != traceparent[3:35] {
				t.Errorf("the handler's span context has trace %s, want the producer's", sc.TraceID())
			}
			if !withParent && sc.IsValid() {
				t.Errorf("the handler's span context is %v, want none", sc)
			}
		})
	}
}
