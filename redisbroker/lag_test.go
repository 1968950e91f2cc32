package redisbroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/producer"
	"github.com/spillway-go/spillway/redisbroker"
)

// The sampler can feed producer.NewLagThrottled directly.
var _ producer.LagReader = (*redisbroker.LagSampler)(nil)

// Lag and pending come from XINFO GROUPS on a real server. Upstream reads
// ahead, so a consumer holding one message in a handler has up to three
// entries pending; lag + pending always accounts for every entry not acked.
func TestLagAndPending(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	topic := uniq("lag")
	publish(t, newPublisher(t, cfg), topic, ids("m", 10)...)
	sub := newSubscriber(t, cfg)
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var held *message.Message
	for i := range 3 {
		select {
		case m := <-ch:
			if i < 2 {
				m.Ack()
			} else {
				held = m
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no delivery")
		}
	}
	var info redisbroker.LagInfo
	waitFor(t, "the read-ahead to settle", 30*time.Second, func() bool {
		info, err = sub.Lag(testCtx(t), topic)
		return err == nil && info.Pending == 3 && info.EntriesRead == 5
	})
	if info.Lag != 5 || info.Backlog() != 8 || info.Consumers != 1 || info.Group != cfg.ConsumerGroup || info.Stream != topic {
		t.Fatalf("lag = %+v; want lag 5, pending 3 (1 in a handler, 2 read ahead), backlog 8", info)
	}
	waitFor(t, "the sampler", 30*time.Second, func() bool {
		b, ok := sub.LagSampler().Backlog()
		return ok && b == 8
	})
	if s := sub.LagSampler().Samples(); len(s) != 1 || s[0].Stream != topic || sub.LagSampler().TotalLag() != 8 {
		t.Fatalf("samples = %+v", s)
	}
	ts, err := sub.LagSource().Lag(testCtx(t))
	if err != nil || len(ts) != 1 || ts[0].Topic != topic || ts[0].Group != cfg.ConsumerGroup || ts[0].Partition != -1 || ts[0].Lag != 8 {
		t.Fatalf("telemetry samples = %+v, %v", ts, err)
	}
	held.Ack()
	for range 7 {
		select {
		case m := <-ch:
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatal("no delivery")
		}
	}
	waitFor(t, "the sampler to see the group caught up", 30*time.Second, func() bool {
		b, ok := sub.LagSampler().Backlog()
		return ok && b == 0
	})
}

func TestLagErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := rawClient(t, srv)
	ctx := testCtx(t)
	if _, err := redisbroker.Lag(ctx, c, "nope", "g"); !errors.Is(err, redisbroker.ErrNoStream) {
		t.Fatalf("missing stream: err = %v", err)
	}
	c.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []string{"k", "v"}})
	if _, err := redisbroker.Lag(ctx, c, "s", "g"); !errors.Is(err, redisbroker.ErrNoGroup) {
		t.Fatalf("missing group: err = %v", err)
	}
	c.XGroupCreate(ctx, "s", "g", "0")
	info, err := redisbroker.Lag(ctx, c, "s", "g")
	if err != nil || info.Lag != 1 || info.Pending != 0 {
		t.Fatalf("lag = %+v, %v", info, err)
	}
}
