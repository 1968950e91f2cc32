package redisbroker_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// A handler that keeps failing one entry: each nack hands the entry over
// again inside the subscriber, and each of those deliveries counts, so
// after MaxDeliveries (default 5) handler runs the next delivery goes to
// the dead-letter stream, once, and the entry is acknowledged. The good
// entries around it are all handled (issue 32).
func TestNackedRedeliveriesCountTowardsMaxDeliveries(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.DeadLetterTopic = uniq("dead")
	topic := uniq("failing")
	sub := newSubscriber(t, cfg)
	if got := sub.Config().MaxDeliveries; got != 5 {
		t.Fatalf("default MaxDeliveries = %d, want 5", got)
	}
	pub := newPublisher(t, cfg)
	dl, err := redisbroker.NewDeadLetter(cfg, redisbroker.WithPublisher(pub))
	if err != nil {
		t.Fatal(err)
	}
	c := newCounter()
	var lastSeen atomic.Int64 // the failing message's Deliveries in its last run
	start := time.Now()
	runRouter(t, sub, topic, func(msg *message.Message) error {
		c.add(msg.UUID)
		if msg.UUID == "bad" {
			lastSeen.Store(int64(redisbroker.Deliveries(msg)))
			return errNacked
		}
		return nil
	}, dl.Middleware)

	good := ids("good", 10)
	publish(t, pub, topic, good[:5]...)
	publish(t, pub, topic, "bad")
	publish(t, pub, topic, good[5:]...)

	waitFor(t, "the failing entry to be dead-lettered", 20*time.Second, func() bool { return dl.Count() == 1 })
	waitFor(t, "the good entries", 20*time.Second, func() bool { return len(c.missing(good)) == 0 })
	raw := rawClient(t, srv)
	ctx := testCtx(t)
	waitFor(t, "every entry to be acknowledged", 20*time.Second, func() bool {
		p, err := raw.XPending(ctx, topic, cfg.ConsumerGroup).Result()
		return err == nil && p.Count == 0
	})
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("took %s, want seconds", took)
	}
	// Given time for a stray extra run or dead letter to show.
	time.Sleep(300 * time.Millisecond)
	c.mu.Lock()
	runs := c.seen["bad"]
	c.mu.Unlock()
	if runs != 5 {
		t.Errorf("the failing handler ran %d times, want 5 (MaxDeliveries)", runs)
	}
	if n := lastSeen.Load(); n != 5 {
		t.Errorf("Deliveries in the last run = %d, want 5", n)
	}
	if n := c.total() - runs; n != len(good) {
		t.Errorf("good entries handled %d times, want %d", n, len(good))
	}
	if n := dl.Count(); n != 1 {
		t.Errorf("dead-lettered %d, want 1", n)
	}
	entries, err := raw.XRange(ctx, cfg.DeadLetterTopic, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("dead-letter stream holds %d entries, want 1", len(entries))
	}
	if uuid := entries[0].Values["_watermill_message_uuid"]; uuid != "bad" {
		t.Errorf("dead-lettered %v, want the failing message", uuid)
	}
	dlMsg, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(entries[0].Values)
	if err != nil {
		t.Fatal(err)
	}
	if reason := dlMsg.Metadata.Get("spillway_deadletter_reason"); !strings.Contains(reason, "delivered 6 times, more than MaxDeliveries (5)") {
		t.Errorf("dead-letter reason %q, want the delivery count and the limit", reason)
	}
}

// With WithoutNackCount only Redis's deliveries count: a nacked message
// handed over again keeps its count and is never dead-lettered for it.
func TestWithoutNackCountLeavesNacksUncounted(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.MaxDeliveries = 2
	cfg.NackResendSleep = 20 * time.Millisecond
	cfg.DeadLetterTopic = uniq("dead")
	topic := uniq("uncounted")
	sub, err := redisbroker.NewSubscriber(cfg, redisbroker.WithLogger(testLogger(t)), redisbroker.WithoutNackCount())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	pub := newPublisher(t, cfg)
	dl, err := redisbroker.NewDeadLetter(cfg, redisbroker.WithPublisher(pub))
	if err != nil {
		t.Fatal(err)
	}
	var runs, maxSeen atomic.Int64
	runRouter(t, sub, topic, func(msg *message.Message) error {
		runs.Add(1)
		if n := int64(redisbroker.Deliveries(msg)); n > maxSeen.Load() {
			maxSeen.Store(n)
		}
		return errNacked
	}, dl.Middleware)
	publish(t, pub, topic, "bad")
	waitFor(t, "six runs", 20*time.Second, func() bool { return runs.Load() >= 6 })
	if n := dl.Count(); n != 0 {
		t.Errorf("dead-lettered %d, want none", n)
	}
	if n := maxSeen.Load(); n != 1 {
		t.Errorf("Deliveries reached %d, want 1 throughout", n)
	}
}
