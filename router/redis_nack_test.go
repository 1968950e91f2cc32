package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/retrygate"
)

// With the default configuration on Redis (retry gate off), a handler that
// keeps failing one entry, with the retry gate off, runs it redis.max_deliveries times; the next
// delivery goes to redis.dead_letter_topic, once, with why, and the entry
// is acknowledged. The good entries are all handled (issue 32: before, the
// nacked entry was retried every 100 ms for ever).
func TestRedisFailingEntryDeadLetteredAfterMaxDeliveries(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := redisConfig(t)
	cfg.CloseTimeout = 10 * time.Second
	cfg.Retry.Disabled = true // the router without the gate, as plain Watermill
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	maxDeliveries := r.cfg.Redis.MaxDeliveries
	if maxDeliveries != 5 {
		t.Fatalf("default redis.max_deliveries = %d, want 5", maxDeliveries)
	}
	var mu sync.Mutex
	runs := make(map[string]int)
	if _, err := r.AddConsumerHandler("h", "jobs", func(msg *message.Message) error {
		mu.Lock()
		runs[msg.UUID]++
		mu.Unlock()
		if msg.UUID == "bad" {
			return errors.New("cannot process this one")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	errc := runRouter(t, r)
	var good []string
	for i := range 8 {
		if i == 4 {
			publishCosted(t, r, "jobs", "bad", 10)
		}
		good = append(good, fmt.Sprintf("good-%d", i))
		publishCosted(t, r, "jobs", good[i], 10)
	}
	dlTopic := r.cfg.Redis.DeadLetterTopic
	_, rc := edgeRedis(t, func(c *Config) { c.Redis.Addr = cfg.Redis.Addr })
	ctx := context.Background()
	group := r.back.group("h")
	waitUntil(t, "the failing entry to be dead-lettered and everything acked", 20*time.Second, func() bool {
		n, _ := rc.XLen(ctx, dlTopic).Result()
		p, err := rc.XPending(ctx, "jobs", group).Result()
		return n >= 1 && err == nil && p.Count == 0 && r.Stats().DeadLettered >= 1
	})
	took := time.Since(start)
	time.Sleep(300 * time.Millisecond) // room for a stray run or dead letter
	closeRouter(t, r, errc)
	if took > 15*time.Second {
		t.Errorf("took %s, want seconds", took)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["bad"] != maxDeliveries {
		t.Errorf("the failing handler ran %d times, want %d (redis.max_deliveries)", runs["bad"], maxDeliveries)
	}
	for _, id := range good {
		if runs[id] != 1 {
			t.Errorf("%s handled %d times, want once", id, runs[id])
		}
	}
	dl, err := rc.XRange(ctx, dlTopic, "-", "+").Result()
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead-letter stream: %d entries (%v), want 1", len(dl), err)
	}
	if uuid := dl[0].Values["_watermill_message_uuid"]; uuid != "bad" {
		t.Errorf("dead-lettered %v, want the failing message", uuid)
	}
	md := entryMetadata(t, dl[0])
	if reason := md["spillway_deadletter_reason"]; !strings.Contains(reason, "delivered 6 times, more than MaxDeliveries (5)") {
		t.Errorf("dead-letter reason %q, want the delivery count and the limit", reason)
	}
	if n := r.Stats().DeadLettered; n != 1 {
		t.Errorf("Stats().DeadLettered = %d, want 1", n)
	}
}

// With the retry gate on, the gate decides how often a failing message
// runs and dead-letters it itself; its nacks (defer: nack) do not count
// towards redis.max_deliveries, which would end the entry before the
// gate's retry.max_attempts.
func TestRedisRetryGateNacksDoNotCountAsDeliveries(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := redisConfig(t)
	cfg.CloseTimeout = 10 * time.Second
	cfg.Retry.Defer = retrygate.DeferNack
	cfg.Retry.MaxAttempts = 8
	// Every failure is deferred at once: the first backoff wait would
	// already run past max_elapsed_time.
	cfg.Retry.InitialInterval = 2 * time.Second
	cfg.Retry.MaxElapsedTime = time.Second
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	if _, err := r.AddConsumerHandler("h", "jobs", func(msg *message.Message) error {
		runs.Add(1)
		return errors.New("cannot process this one")
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "jobs", "bad", 10)
	gateDL := r.cfg.Retry.DeadLetterTopicFor("jobs")
	_, rc := edgeRedis(t, func(c *Config) { c.Redis.Addr = cfg.Redis.Addr })
	ctx := context.Background()
	waitUntil(t, "a dead letter", 20*time.Second, func() bool {
		a, _ := rc.XLen(ctx, gateDL).Result()
		b, _ := rc.XLen(ctx, r.cfg.Redis.DeadLetterTopic).Result()
		return a+b > 0
	})
	time.Sleep(300 * time.Millisecond)
	closeRouter(t, r, errc)
	if n, _ := rc.XLen(ctx, r.cfg.Redis.DeadLetterTopic).Result(); n != 0 {
		t.Errorf("%d entries in redis.dead_letter_topic, want none: the nacks of the gate were counted", n)
	}
	if n, _ := rc.XLen(ctx, gateDL).Result(); n != 1 {
		t.Errorf("%d entries in the gate's dead-letter topic, want 1", n)
	}
	if n := runs.Load(); n != 8 {
		t.Errorf("handler ran %d times, want 8 (retry.max_attempts)", n)
	}
}
