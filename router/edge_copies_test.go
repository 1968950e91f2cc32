package router

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/shedding"
	"github.com/spillway-go/spillway/telemetry"
)

// recBroker is a persistent GoChannel whose publisher records a copy of
// every message that reaches the broker, by topic.
type recBroker struct {
	ch   *gochannel.GoChannel
	mu   sync.Mutex
	msgs map[string][]*message.Message
}

func newRecBroker() *recBroker {
	return &recBroker{
		ch:   gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{}),
		msgs: map[string][]*message.Message{},
	}
}

func (b *recBroker) Publish(topic string, msgs ...*message.Message) error {
	b.mu.Lock()
	for _, m := range msgs {
		b.msgs[topic] = append(b.msgs[topic], m.Copy())
	}
	b.mu.Unlock()
	return b.ch.Publish(topic, msgs...)
}

func (b *recBroker) Close() error { return b.ch.Close() }

func (b *recBroker) on(topic string) []*message.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*message.Message(nil), b.msgs[topic]...)
}

// waitFor polls until topic holds n messages or d passes.
func (b *recBroker) waitFor(topic string, n int, d time.Duration) []*message.Message {
	deadline := time.Now().Add(d)
	for {
		got := b.on(topic)
		if len(got) >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *recBroker) custom() CustomBroker {
	return CustomBroker{
		Publisher:  b,
		Subscriber: func(string, string) (message.Subscriber, error) { return b.ch, nil },
	}
}

func fastRetry() RetryConfig {
	var rc RetryConfig
	rc.MaxAttempts = 2
	rc.InitialInterval, rc.MaxInterval = time.Millisecond, time.Millisecond
	return rc
}

// A payload that cannot be counted ("garbage", a JSON document without
// geometry) and has no vertex_count reaches the dead-letter topic: the
// retry and dead-letter copies are published as they are, never
// re-stamped, so they keep the original's charge or none (issue 13,
// item 3).
func TestEdgeUncountableIsDeadLettered(t *testing.T) {
	b := newRecBroker()
	r, err := New(Config{CloseTimeout: 10 * time.Second, Retry: fastRetry()}, nil, WithBroker(b.custom()))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	if _, err := r.AddConsumerHandler("h", "in", func(*message.Message) error {
		runs.Add(1)
		return errors.New("cannot process")
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	// Straight to the broker: the router's own publisher would refuse it.
	if err := b.ch.Publish("in", message.NewMessage("garbage", []byte("garbage")),
		message.NewMessage("order", []byte(`{"orderId":1}`))); err != nil {
		t.Fatal(err)
	}
	dl := b.waitFor("in.dead_letter", 2, 10*time.Second)
	closeRouter(t, r, errc)
	if len(dl) != 2 {
		t.Fatalf("%d messages dead-lettered after %d runs, want 2", len(dl), runs.Load())
	}
	for _, m := range dl {
		if v, ok := m.Metadata[cost.MetadataKey]; ok {
			t.Errorf("dead letter %s stamped vertex_count %q, want the original's (none)", m.UUID, v)
		}
	}
	if n := runs.Load(); n != 4 {
		t.Errorf("handler ran %d times, want 4 (2 attempts each)", n)
	}
}

// A handler's outputs are published even when their payload is no
// geometry (unstamped, not refused, so the input is not redelivered
// forever), and without any spillway_* key copied from the input, which
// would misroute the output's own retries (issue 13, items 1 and 3).
func TestEdgeHandlerOutputs(t *testing.T) {
	b := newRecBroker()
	r, err := New(Config{CloseTimeout: 10 * time.Second, Retry: fastRetry()}, nil, WithBroker(b.custom()))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	if _, err := r.AddHandler("h", "in", "out", func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		copied := msg.Copy()
		copied.UUID = "copied"
		return []*message.Message{message.NewMessage("order", []byte(`{"orderId":1}`)), copied}, nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "in", "input", 5, retrygate.OriginTopicKey, "payments", "spillway_shed_reason", "x")
	out := b.waitFor("out", 2, 10*time.Second)
	time.Sleep(100 * time.Millisecond) // room for a redelivery to show up
	closeRouter(t, r, errc)
	if len(out) != 2 || runs.Load() != 1 {
		t.Fatalf("%d outputs after %d runs, want 2 after 1", len(out), runs.Load())
	}
	for _, m := range out {
		for k := range m.Metadata {
			if strings.HasPrefix(k, "spillway_") {
				t.Errorf("output %s carries %s", m.UUID, k)
			}
		}
	}
}

// Retry and dead-letter copies continue the original's trace: the copy's
// traceparent is in the trace of the delivery it comes from (issue 13,
// item 13).
func TestEdgeCopiesContinueTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	b := newRecBroker()
	r, err := New(Config{CloseTimeout: 10 * time.Second, Retry: fastRetry()}, nil, WithBroker(b.custom()),
		WithTelemetry(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(propagation.TraceContext{})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddConsumerHandler("h", "in", func(*message.Message) error {
		return errors.New("cannot process")
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "in", "m", 5)
	dl := b.waitFor("in.dead_letter", 1, 10*time.Second)
	closeRouter(t, r, errc)
	in := b.on("in")
	if len(in) != 1 || len(dl) != 1 {
		t.Fatalf("in %d, dead letters %d; want 1, 1", len(in), len(dl))
	}
	traceOf := func(m *message.Message) trace.TraceID {
		ctx := propagation.TraceContext{}.Extract(t.Context(), propagation.MapCarrier(m.Metadata))
		return trace.SpanContextFromContext(ctx).TraceID()
	}
	want := traceOf(in[0])
	if !want.IsValid() {
		t.Fatal("the published message carries no trace context")
	}
	if got := traceOf(dl[0]); got != want {
		t.Errorf("dead letter in trace %s, want the original's %s", got, want)
	}
}

// telemetry.link_producer: the consumer span starts its own trace and
// links to the producer's span (issue 13, item 13).
func TestEdgeLinkProducerConfig(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	b := newRecBroker()
	cfg := Config{CloseTimeout: 10 * time.Second}
	cfg.Telemetry.LinkProducer = true
	r, err := New(cfg, nil, WithBroker(b.custom()), WithTelemetry(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(propagation.TraceContext{})))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	if _, err := r.AddConsumerHandler("h", "in", func(*message.Message) error {
		close(done)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "in", "m", 5)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("not consumed")
	}
	closeRouter(t, r, errc)
	var send, process sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "send in":
			send = s
		case "process in":
			process = s
		}
	}
	if send == nil || process == nil {
		t.Fatalf("spans: send %v, process %v", send, process)
	}
	if process.Parent().IsValid() || process.SpanContext().TraceID() == send.SpanContext().TraceID() {
		t.Errorf("consumer span's parent %v: want a new trace", process.Parent())
	}
	if l := process.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != send.SpanContext().SpanID() {
		t.Errorf("consumer span's links %v, want the producer span", l)
	}
}

// A Redis entry that cannot be unmarshalled is dead-lettered through the
// tracing publisher: its send span is a child of the delivery's consumer
// span (issue 13, item 13).
func TestEdgeRedisDeadLetterTraced(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	cfg := redisConfig(t)
	cfg.Redis.DeadLetterTopic = "shapes.malformed"
	r, err := New(cfg, nil, WithTelemetry(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(propagation.TraceContext{})))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.AddConsumerHandler("sink", "shapes", func(*message.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	rc := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
	defer rc.Close()
	if err := rc.XAdd(t.Context(), &redis.XAddArgs{Stream: "shapes", Values: []any{"payload", "not a watermill entry"}}).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().DeadLettered < 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	closeRouter(t, r, errc)
	var send, process sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "send shapes.malformed":
			send = s
		case "process shapes":
			process = s
		}
	}
	if process == nil || send == nil {
		t.Fatalf("spans: process %v, send to the dead-letter stream %v; want both", process != nil, send != nil)
	}
	if send.Parent().SpanID() != process.SpanContext().SpanID() {
		t.Errorf("dead letter's send span parent %v, want the consumer span %v", send.Parent().SpanID(), process.SpanContext().SpanID())
	}
}

// A handler that returns a copy of its input passes on none of the
// input's spillway_* keys (issue 13, item 1).
func TestEdgeOutputsStripped(t *testing.T) {
	b := newRecBroker()
	r, err := New(Config{CloseTimeout: 10 * time.Second}, nil, WithBroker(b.custom()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddHandler("h", "in", "out", func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{msg.Copy()}, nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "in", "input", 5, retrygate.OriginTopicKey, "payments", "spillway_attempt", "3")
	out := b.waitFor("out", 1, 10*time.Second)
	closeRouter(t, r, errc)
	if len(out) != 1 {
		t.Fatalf("%d outputs, want 1", len(out))
	}
	for k := range out[0].Metadata {
		if strings.HasPrefix(k, "spillway_") {
			t.Errorf("output carries %s", k)
		}
	}
	if out[0].Metadata.Get(cost.MetadataKey) != "5" {
		t.Errorf("output vertex_count %q, want the copied 5", out[0].Metadata.Get(cost.MetadataKey))
	}
}

// A shedding audit copy of a payload that cannot be counted reaches the
// audit topic, unstamped like its original (issue 13, item 3).
func TestEdgeUncountableAuditCopy(t *testing.T) {
	b := newRecBroker()
	cfg := Config{CloseTimeout: 10 * time.Second}
	cfg.Shedding.Config = shedding.Config{Topics: []string{"pos"}, AuditTopic: "pos.shed",
		VersionGuard: shedding.VersionGuardConfig{Enabled: true}}
	r, err := New(cfg, nil, WithBroker(b.custom()))
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan string, 4)
	if _, err := r.AddConsumerHandler("h", "pos", func(m *message.Message) error {
		handled <- m.UUID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "pos", "v2", 5, "entity_id", "e", "entity_version", "2")
	<-handled
	// The version guard holds v2 as done once it is acked; GoChannel
	// delivers each message on its own goroutine, so v1 must not go out
	// before that.
	if n, _ := r.settling.wait(time.Now().Add(10 * time.Second)); n != 0 {
		t.Fatalf("v2 not acked: %d messages unsettled", n)
	}
	stale := message.NewMessage("v1", []byte("garbage"))
	stale.Metadata.Set("entity_id", "e")
	stale.Metadata.Set("entity_version", "1")
	if err := b.ch.Publish("pos", stale); err != nil {
		t.Fatal(err)
	}
	audit := b.waitFor("pos.shed", 1, 10*time.Second)
	st := r.Stats()
	closeRouter(t, r, errc)
	if len(audit) != 1 || audit[0].UUID != "v1" {
		t.Fatalf("audit topic holds %v, want v1 (shedding %+v, budget %+v)", audit, st.Shedding, st.Budget)
	}
	if v, ok := audit[0].Metadata[cost.MetadataKey]; ok {
		t.Errorf("audit copy stamped %q, want no count", v)
	}
}

// A custom broker's spans say messaging.system watermill, unless
// WithTelemetry names the system: the router's own default comes before
// the options given.
func TestCustomBrokerMessagingSystem(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []telemetry.Option
		want string
	}{
		{"default", nil, "watermill"},
		{"named", []telemetry.Option{telemetry.WithMessagingSystem("nats")}, "nats"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			b := newRecBroker()
			opts := append([]telemetry.Option{telemetry.WithTracerProvider(tp)}, tc.opts...)
			r, err := New(Config{CloseTimeout: 10 * time.Second}, nil, WithBroker(b.custom()), WithTelemetry(opts...))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			if _, err := r.AddConsumerHandler("h", "in", func(*message.Message) error {
				close(done)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			errc := runRouter(t, r)
			publishCosted(t, r, "in", "m", 5)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("not consumed")
			}
			closeRouter(t, r, errc)
			kinds := 0
			for _, s := range rec.Ended() {
				if s.Name() != "send in" && s.Name() != "process in" {
					continue
				}
				kinds++
				var got string
				for _, kv := range s.Attributes() {
					if kv.Key == "messaging.system" {
						got = kv.Value.AsString()
					}
				}
				if got != tc.want {
					t.Errorf("span %q: messaging.system %q, want %q", s.Name(), got, tc.want)
				}
			}
			if kinds < 2 {
				t.Errorf("saw %d send/process spans, want both", kinds)
			}
		})
	}
}
