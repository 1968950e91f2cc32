package router

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/spillway-go/spillway/telemetry"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

// edgeRedis is a router on a fresh redis-server with short Redis timings,
// and a raw client to play the peer with.
func edgeRedis(t *testing.T, mutate func(*Config)) (Config, *redis.Client) {
	t.Helper()
	cfg := redisConfig(t)
	cfg.CloseTimeout = 10 * time.Second
	cfg.Redis.ConsumerGroup = "edge"
	cfg.Redis.MaxIdleTime = 3 * time.Second // keep-alive every second
	cfg.Redis.ClaimInterval = 100 * time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	rc := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
	t.Cleanup(func() { _ = rc.Close() })
	return cfg, rc
}

// entryIDs returns the IDs of the entries of stream, oldest first.
func entryIDs(t *testing.T, rc *redis.Client, stream string) []string {
	t.Helper()
	msgs, err := rc.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

// pendingOwner returns the consumer id is pending for in group, or "".
func pendingOwner(t *testing.T, rc *redis.Client, stream, group, id string) string {
	t.Helper()
	p, err := rc.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: group, Start: id, End: id, Count: 1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(p) == 0 {
		return ""
	}
	return p[0].Consumer
}

// entryMetadata decodes the metadata of a stream entry written by a
// Watermill publisher.
func entryMetadata(t *testing.T, e redis.XMessage) message.Metadata {
	t.Helper()
	msg, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(e.Values)
	if err != nil {
		t.Fatal(err)
	}
	return msg.Metadata
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A peer claims an entry while this router's handler still works on it:
// when the handler finishes, its ack must not remove the entry from the
// peer's pending list (issue 13, item 5).
func TestEdgeRedisRunningHandlerNotAckedOverPeerClaim(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg, rc := edgeRedis(t, nil)
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	if _, err := r.AddConsumerHandler("h", "jobs", func(*message.Message) error {
		close(started)
		<-release
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "jobs", "a", 10)
	<-started
	group := r.back.group("h")
	id := entryIDs(t, rc, "jobs")[0]
	// The peer's claim loop takes the entry (as after a missed refresh).
	if err := rc.XClaim(context.Background(), &redis.XClaimArgs{
		Stream: "jobs", Group: group, Consumer: "peer", MinIdle: 0, Messages: []string{id},
	}).Err(); err != nil {
		t.Fatal(err)
	}
	close(release)
	closeRouter(t, r, errc)
	if owner := pendingOwner(t, rc, "jobs", group, id); owner != "peer" {
		t.Fatalf("entry pending for %q after the first owner finished, want still pending for the peer that claimed it", owner)
	}
}

// A message waiting for budget whose entry a peer claims steps aside: it
// does not run here, and its entry stays the peer's (issue 13, item 5).
func TestEdgeRedisWaiterStepsAsideWhenEntryLost(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg, rc := edgeRedis(t, func(c *Config) {
		c.Budget.Vertices = 10
		c.Redis.Consumers = 2
	})
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ran []string
	var runs atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	if _, err := r.AddConsumerHandler("h", "jobs", func(msg *message.Message) error {
		runs.Add(1)
		ran = append(ran, msg.UUID) // one at a time: the budget holds one
		if msg.UUID == "a" {
			close(started)
			<-release
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	group := r.back.group("h")
	ctx := context.Background()
	// Both consumers blocked in their first read (Redis lists a consumer
	// in XINFO CONSUMERS only once it has read something) before anything is
	// published: b must reach the consumer that is not busy with a. On a
	// loaded machine the second consumer's first read can come late, and
	// the first consumer, back from handing a over, would read b itself,
	// where it waits for a's ack instead of for budget.
	waitUntil(t, "both consumers to block in a read", 10*time.Second, func() bool {
		list, err := rc.ClientList(ctx).Result()
		blocked := 0
		for line := range strings.Lines(list) {
			if strings.Contains(line, " flags=b ") && strings.Contains(line, " cmd=xreadgroup ") {
				blocked++
			}
		}
		return err == nil && blocked >= 2
	})
	publishCosted(t, r, "jobs", "a", 10)
	<-started
	publishCosted(t, r, "jobs", "b", 10)
	waitUntil(t, "b to be delivered and wait for budget", 10*time.Second, func() bool {
		n, err := rc.XPending(ctx, "jobs", group).Result()
		return err == nil && n.Count == 2 && r.Stats().Budget.Waiting == 1
	})
	b := entryIDs(t, rc, "jobs")[1]
	if err := rc.XClaim(ctx, &redis.XClaimArgs{Stream: "jobs", Group: group, Consumer: "peer", MinIdle: 0, Messages: []string{b}}).Err(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the waiter to step aside", 10*time.Second, func() bool { return r.Stats().Revocations == 1 })
	close(release)
	closeRouter(t, r, errc)
	if runs.Load() != 1 || ran[0] != "a" {
		t.Errorf("handler ran %v, want only a (b was claimed by a peer while it waited)", ran)
	}
	if owner := pendingOwner(t, rc, "jobs", group, b); owner != "peer" {
		t.Errorf("b pending for %q, want still pending for the peer", owner)
	}
}

// An entry Redis has delivered more than redis.max_deliveries times goes
// to the dead-letter topic instead of its handler: a payload that kills
// its consumer process kills at most that many (issue 13, item 12). The
// move is counted as dead-lettered, reason redelivered.
func TestEdgeRedisPoisonDeadLetteredAfterMaxDeliveries(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg, rc := edgeRedis(t, func(c *Config) {
		c.Redis.MaxDeliveries = 2
		c.Redis.MaxIdleTime = time.Second
		c.Redis.DeadLetterTopic = "jobs.poison"
	})
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	r, err := New(cfg, nil, WithTelemetry(telemetry.WithMeterProvider(mp)))
	if err != nil {
		t.Fatal(err)
	}
	group := r.back.group("h")
	ctx := context.Background()
	if err := rc.XGroupCreateMkStream(ctx, "jobs", group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	publishCosted(t, r, "jobs", "poison", 10)
	// Two consumers took it and died with it (kill -9): delivery count 2.
	if err := rc.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "dead-1", Streams: []string{"jobs", ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	id := entryIDs(t, rc, "jobs")[0]
	if err := rc.XClaim(ctx, &redis.XClaimArgs{Stream: "jobs", Group: group, Consumer: "dead-2", MinIdle: 0, Messages: []string{id}}).Err(); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	if _, err := r.AddConsumerHandler("h", "jobs", func(*message.Message) error {
		runs.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "jobs", "good", 10)
	waitUntil(t, "the poison to be dead-lettered", 15*time.Second, func() bool {
		n, _ := rc.XLen(ctx, "jobs.poison").Result()
		return n == 1 && runs.Load() == 1
	})
	waitUntil(t, "the poison to be acknowledged", 10*time.Second, func() bool { return pendingOwner(t, rc, "jobs", group, id) == "" })
	closeRouter(t, r, errc)
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want once (the good message only)", n)
	}
	dl, err := rc.XRange(ctx, "jobs.poison", "-", "+").Result()
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead-letter stream: %v %v", dl, err)
	}
	md := entryMetadata(t, dl[0])
	if reason := md["spillway_deadletter_reason"]; !strings.Contains(reason, "delivered 3 times") {
		t.Errorf("dead-letter reason %q, want the delivery count", reason)
	}
	if r.Stats().DeadLettered != 1 {
		t.Errorf("Stats().DeadLettered = %d, want 1", r.Stats().DeadLettered)
	}
	if got := collectCounter(t, reader, "spillway.messages.dead_lettered"); got["jobs/redelivered"] != 1 || len(got) != 1 {
		t.Errorf("spillway.messages.dead_lettered = %v, want jobs/redelivered: 1", got)
	}
}

// An entry claimed from a dead consumer is a broker redelivery: the retry
// gate defers it while the consumer is saturated instead of running it
// before fresh work (issue 13, item 12).
func TestEdgeRedisRedeliveryYieldsUnderPressure(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg, rc := edgeRedis(t, func(c *Config) {
		c.Budget.Vertices = 10
		c.Redis.MaxIdleTime = 2 * time.Second
		c.Retry.MaxInterval = 200 * time.Millisecond
		c.Retry.MaxElapsedTime = 500 * time.Millisecond
	})
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	group := r.back.group("h")
	ctx := context.Background()
	if err := rc.XGroupCreateMkStream(ctx, "jobs", group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	publishCosted(t, r, "jobs", "orphan", 10)
	// A consumer read it and died: it is claimed once idle.
	if err := rc.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "dead", Streams: []string{"jobs", ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	if _, err := r.AddConsumerHandler("blocker", "fresh", func(*message.Message) error {
		close(started)
		<-release
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var orphanRuns atomic.Int64
	if _, err := r.AddConsumerHandler("h", "jobs", func(*message.Message) error {
		orphanRuns.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "fresh", "fresh", 10)
	<-started // fresh work holds the whole budget
	waitUntil(t, "the redelivered entry to be deferred", 15*time.Second, func() bool {
		st := r.Stats().Retry
		return st != nil && st.Deferred >= 1
	})
	if n := orphanRuns.Load(); n != 0 {
		t.Errorf("the redelivered entry ran %d times while the consumer was saturated", n)
	}
	close(release)
	waitUntil(t, "the deferred entry to run from the retry topic", 15*time.Second, func() bool { return orphanRuns.Load() == 1 })
	closeRouter(t, r, errc)
}

// A malformed entry's dead-letter copy is published through tracing: it
// carries a trace context in the producer's trace (issue 13, item 13).
func TestEdgeRedisMalformedDeadLetterTraced(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg, rc := edgeRedis(t, func(c *Config) { c.Redis.DeadLetterTopic = "jobs.malformed" })
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	r, err := New(cfg, nil, WithTelemetry(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(propagation.TraceContext{})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddConsumerHandler("h", "jobs", func(*message.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	ctx, span := tp.Tracer("test").Start(context.Background(), "producer")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	span.End()
	src := message.NewMessage("x", []byte("x"))
	for k, v := range carrier {
		src.Metadata.Set(k, v)
	}
	values, err := redisstream.DefaultMarshallerUnmarshaller{}.Marshal("jobs", src)
	if err != nil {
		t.Fatal(err)
	}
	// No message UUID: no Watermill publisher wrote this.
	delete(values, redisstream.UUIDHeaderKey)
	if err := rc.XAdd(ctx, &redis.XAddArgs{Stream: "jobs", Values: values}).Err(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the malformed entry to be dead-lettered", 15*time.Second, func() bool { return r.Stats().DeadLettered == 1 })
	closeRouter(t, r, errc)
	dl, err := rc.XRange(ctx, "jobs.malformed", "-", "+").Result()
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead-letter stream: %v %v", dl, err)
	}
	got := entryMetadata(t, dl[0])
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(got)))
	if !sc.IsValid() {
		t.Fatalf("dead-letter copy carries no trace context: %v", got)
	}
	if sc.TraceID() != span.SpanContext().TraceID() {
		t.Errorf("dead-letter copy in trace %s, want the producer's %s", sc.TraceID(), span.SpanContext().TraceID())
	}
	var published bool
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer && s.SpanContext().SpanID() == sc.SpanID() {
			published = true
		}
	}
	if !published {
		t.Error("no producer span for the dead-letter copy")
	}
}
