package redisbroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

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
		info, err = sub.LagInfo(testCtx(t), topic)
		return err == nil && info.Pending == 3 && info.EntriesRead == 5
	})
	if info.Lag != 5 || info.Backlog() != 8 || info.Consumers != 1 || info.Group != cfg.ConsumerGroup || info.Stream != topic {
		t.Fatalf("lag = %+v; want lag 5, pending 3 (1 in a handler, 2 read ahead), backlog 8", info)
	}
	if got := sub.Topics(); len(got) != 1 || got[0] != topic {
		t.Fatalf("Topics() = %v; want [%s]", got, topic)
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
	waitFor(t, "the group to catch up", 30*time.Second, func() bool {
		info, err = sub.LagInfo(testCtx(t), topic)
		return err == nil && info.Backlog() == 0
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
