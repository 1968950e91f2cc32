package redisbroker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// publishUntilAccepted retries one message until the server takes it, as a
// producer riding out an outage would. It returns false if it never did.
func publishUntilAccepted(pub message.Publisher, topic, id string, deadline time.Time) bool {
	for time.Now().Before(deadline) {
		if err := pub.Publish(topic, message.NewMessage(id, []byte("payload-"+id))); err == nil {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// redis-server is killed with SIGKILL mid-stream and restarted from its AOF
// (fsync always). The subscriber rides it out (upstream retries reads every
// 500 ms; go-redis reconnects; acks are retried until they land) and every
// message whose publish was acknowledged is processed at least once.
func TestRedisKilledMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	cfg := testConfig(srv)
	topic := uniq("kill")
	sub := newSubscriber(t, cfg)
	c := newCounter()
	runRouter(t, sub, topic, func(msg *message.Message) error {
		c.add(msg.UUID)
		time.Sleep(2 * time.Millisecond) // some work, so entries are in flight at the kill
		return nil
	})
	pub := newPublisher(t, cfg)

	const total = 300
	var (
		mu        sync.Mutex
		published []string
	)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		deadline := time.Now().Add(90 * time.Second)
		for i := range total {
			id := fmt.Sprintf("k-%03d", i)
			if publishUntilAccepted(pub, topic, id, deadline) {
				mu.Lock()
				published = append(published, id)
				mu.Unlock()
			}
			time.Sleep(3 * time.Millisecond)
		}
	}()
	waitFor(t, "a third of the stream to be processed", 60*time.Second, func() bool { return c.distinct() >= total/3 })
	srv.Kill()
	time.Sleep(time.Second)
	srv.Restart()
	<-pubDone

	mu.Lock()
	want := append([]string(nil), published...)
	mu.Unlock()
	if len(want) != total {
		t.Fatalf("only %d of %d publishes were ever accepted", len(want), total)
	}
	waitFor(t, "every acknowledged message to be processed", 90*time.Second, func() bool { return len(c.missing(want)) == 0 })
	t.Logf("%d messages, %d handler runs (duplicates are allowed: at-least-once)", len(want), c.total())
}

// A server restarted without persistence comes back without the stream and
// the consumer group. Upstream would log NOGROUP forever; the subscriber
// recreates the group and goes on with new messages. (Messages the server
// lost are lost: only persistence prevents that.)
func TestRedisRestartedWithoutPersistenceRecreatesGroup(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	topic := uniq("nogroup")
	sub := newSubscriber(t, cfg)
	c := newCounter()
	runRouter(t, sub, topic, func(msg *message.Message) error {
		c.add(msg.UUID)
		return nil
	})
	pub := newPublisher(t, cfg)
	before := ids("before", 10)
	publish(t, pub, topic, before...)
	waitFor(t, "messages before the restart", 30*time.Second, func() bool { return len(c.missing(before)) == 0 })

	srv.Restart() // kill, start empty
	after := ids("after", 10)
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range after {
		if !publishUntilAccepted(pub, topic, id, deadline) {
			t.Fatal("publisher never reconnected")
		}
	}
	waitFor(t, "messages after the restart", 60*time.Second, func() bool { return len(c.missing(after)) == 0 })
}

// A consumer that dies holding a message (its subscriber closed without an
// ack) leaves the entry pending; a peer claims it after MaxIdleTime and
// processes it.
func TestConsumerKilledMidMessagePeerTakesOver(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.MaxIdleTime = 2 * time.Second
	cfg.ClaimInterval = 200 * time.Millisecond
	topic := uniq("dies")

	deadCfg := cfg
	deadCfg.Consumer = cfg.Consumer + "-dead"
	dying, err := redisbroker.NewSubscriber(deadCfg, redisbroker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := dying.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, newPublisher(t, cfg), topic, "orphan")
	select {
	case msg := <-ch:
		if msg.UUID != "orphan" {
			t.Fatalf("got %s", msg.UUID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	if err := dying.Close(); err != nil { // no ack: the process is gone
		t.Fatal(err)
	}
	died := time.Now()

	peerCfg := cfg
	peerCfg.Consumer = cfg.Consumer + "-peer"
	peer := newSubscriber(t, peerCfg)
	took := make(chan time.Time, 1)
	runRouter(t, peer, topic, func(msg *message.Message) error {
		if msg.UUID == "orphan" {
			select {
			case took <- time.Now():
			default:
			}
		}
		return nil
	})
	select {
	case at := <-took:
		t.Logf("peer took over %s after the consumer died", at.Sub(died).Round(time.Millisecond))
	case <-time.After(60 * time.Second):
		t.Fatal("no peer took over the orphaned entry")
	}
}

// A consumer restarted under the same name finds what its previous
// incarnation left pending at once, long before MaxIdleTime.
func TestRestartedConsumerRecoversItsPendingEntriesAtOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.MaxIdleTime = 10 * time.Minute // the idle claim cannot explain a quick recovery
	topic := uniq("restart")

	first, err := redisbroker.NewSubscriber(cfg, redisbroker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := first.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	want := ids("held", 3)
	publish(t, newPublisher(t, cfg), topic, want...)
	select {
	case <-ch: // in a handler, never acked
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	// The rest are delivered too (to the other consumer, or read ahead).
	raw := rawClient(t, srv)
	waitFor(t, "every entry to be delivered", 30*time.Second, func() bool {
		p, err := raw.XPending(context.Background(), topic, cfg.ConsumerGroup).Result()
		return err == nil && p.Count == int64(len(want))
	})
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := newSubscriber(t, cfg) // same group, same consumer names
	c := newCounter()
	start := time.Now()
	runRouter(t, second, topic, func(msg *message.Message) error {
		c.add(msg.UUID)
		return nil
	})
	waitFor(t, "the restarted consumer to recover its entries", 30*time.Second, func() bool { return len(c.missing(want)) == 0 })
	t.Logf("recovered %d entries in %s (MaxIdleTime %s)", len(want), time.Since(start).Round(time.Millisecond), cfg.MaxIdleTime)
}

// Restart recovery asks for every consumer's pending entries at once and
// pages through a consumer holding more than one page: every entry left
// pending for any of the subscriber's names, and only those, is made
// claimable (idle past MaxIdleTime) by the first Subscribe.
func TestRestartRecoveryCoversEveryConsumerAndPage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 3
	cfg.MaxIdleTime = 10 * time.Minute
	topic := uniq("recover-pages")
	ctx := testCtx(t)
	raw := rawClient(t, srv)
	if err := raw.XGroupCreateMkStream(ctx, topic, cfg.ConsumerGroup, "0").Err(); err != nil {
		t.Fatal(err)
	}
	names := cfg.ConsumerNames()
	// names[0] holds more than one XPENDING page (500), names[2] a few,
	// names[1] none; a stranger holds some too.
	held := map[string]int{names[0]: 1100, names[2]: 7, "stranger": 5}
	for _, who := range []string{names[0], names[2], "stranger"} {
		pipe := raw.Pipeline()
		for range held[who] {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{"payload": "x"}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if err := raw.XReadGroup(ctx, &redis.XReadGroupArgs{Group: cfg.ConsumerGroup, Consumer: who, Streams: []string{topic, ">"}, Count: int64(held[who])}).Err(); err != nil {
			t.Fatal(err)
		}
	}

	sub := newSubscriber(t, cfg)
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, err := sub.Subscribe(subCtx, topic); err != nil {
		t.Fatal(err)
	}
	// Stopped, so that nothing moves while the entries are counted.
	cancel()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	// Upstream's first claim pass may already have taken a few of them
	// over (claimed to its own consumer name, one by one, stopping at the
	// first it cannot hand over: nobody reads here), which resets their
	// idle time: allow two per consumer. Counted over all the
	// subscriber's names, since a claim moves an entry between them.
	slack := 2 * cfg.Consumers
	var ours, oursPending, oursRecovered int
	for who, n := range held {
		pending, err := raw.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: topic, Group: cfg.ConsumerGroup, Start: "-", End: "+", Count: 10_000, Consumer: who}).Result()
		if err != nil {
			t.Fatal(err)
		}
		recovered := 0
		for _, p := range pending {
			if p.Idle >= cfg.MaxIdleTime {
				recovered++
			}
		}
		if who == "stranger" {
			if len(pending) != n || recovered != 0 {
				t.Fatalf("a stranger's entries were touched: %d pending (want %d), %d made claimable", len(pending), n, recovered)
			}
			continue
		}
		ours += n
	}
	for _, name := range names {
		pending, err := raw.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: topic, Group: cfg.ConsumerGroup, Start: "-", End: "+", Count: 10_000, Consumer: name}).Result()
		if err != nil {
			t.Fatal(err)
		}
		oursPending += len(pending)
		for _, p := range pending {
			if p.Idle >= cfg.MaxIdleTime {
				oursRecovered++
			}
		}
	}
	if oursPending != ours {
		t.Fatalf("%d entries pending for the subscriber's consumers, want %d", oursPending, ours)
	}
	if oursRecovered < ours-slack {
		t.Fatalf("%d of %d pending entries made claimable", oursRecovered, ours)
	}
}
