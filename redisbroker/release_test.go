package redisbroker_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// TestCloseReleasesWhatItDidNotRun: a subscriber that closes (a fleet
// scaling in) leaves behind entries it read but never handed to a
// handler, and a message it handed over that was nacked. A peer takes
// those at once, not after MaxIdleTime, and the entries never handed over
// have their delivery taken back. A message handed over and still out (its
// handler may be running) is left to the idle claim.
func TestCloseReleasesWhatItDidNotRun(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 2
	cfg.MaxIdleTime = 20 * time.Second
	topic := uniq("release")
	pub := newPublisher(t, cfg)
	for i := range 20 {
		if err := pub.Publish(topic, message.NewMessage("m-"+strconv.Itoa(i), []byte("{}"))); err != nil {
			t.Fatal(err)
		}
	}
	ctx := testCtx(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()

	a, err := redisbroker.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := a.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	held := receive(t, msgs)   // out with a handler when a closes
	nacked := receive(t, msgs) // the other consumer's, nacked
	nacked.Nack()
	waitFor(t, "entries read ahead", 10*time.Second, func() bool {
		p, err := client.XPending(ctx, topic, cfg.ConsumerGroup).Result()
		return err == nil && p.Count >= 4
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	p, err := client.XPending(ctx, topic, cfg.ConsumerGroup).Result()
	if err != nil {
		t.Fatal(err)
	}
	left := p.Count
	// What a left behind: the held entry as it was; the others claimable
	// now, those never handed over with their delivery taken back.
	ext, err := client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: topic, Group: cfg.ConsumerGroup, Start: "-", End: "+", Count: 100}).Result()
	if err != nil {
		t.Fatal(err)
	}
	heldID, nackedID := held.Metadata.Get("_spillway_redis_id"), nacked.Metadata.Get("_spillway_redis_id")
	for _, e := range ext {
		switch e.ID {
		case heldID:
			if e.Idle >= cfg.MaxIdleTime {
				t.Errorf("the held entry was released (idle %v)", e.Idle)
			}
		case nackedID:
			if e.Idle < cfg.MaxIdleTime {
				t.Errorf("the nacked entry was not released (idle %v)", e.Idle)
			}
		default:
			if e.Idle < cfg.MaxIdleTime || e.RetryCount != 0 {
				t.Errorf("entry %s read ahead: idle %v, deliveries %d; want past MaxIdleTime (%v) and 0", e.ID, e.Idle, e.RetryCount, cfg.MaxIdleTime)
			}
		}
	}

	// A peer, as a new process of the fleet: other consumer names.
	peerCfg := cfg
	peerCfg.Consumer = uniq("peer")
	b := newSubscriber(t, peerCfg)
	in, err := b.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	deadline := time.After(5 * time.Second) // well under MaxIdleTime
	for len(got) < 19 {
		select {
		case m := <-in:
			got[m.UUID] = true
			m.Ack()
		case <-deadline:
			t.Fatalf("after 5 s the peer has %d of the 19 messages a did not keep (a left %d pending); MaxIdleTime is %v", len(got), left, cfg.MaxIdleTime)
		}
	}
	if _, ok := got[held.UUID]; ok {
		t.Errorf("the message out with a's handler (%s) was released while it may still run", held.UUID)
	}
	if _, ok := got[nacked.UUID]; !ok {
		t.Errorf("the nacked message %s was not released", nacked.UUID)
	}
	t.Logf("a left %d entries pending; the peer took %d within 5 s", left, len(got))
}
