package redisbroker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// What the keep-alive relies on, checked on a real server: XCLAIM to the
// owning consumer with min-idle 0 and JUSTID resets the entry's idle time
// and leaves its delivery count and owner alone; XCLAIM without JUSTID
// counts a delivery.
func TestXClaimJustIDResetsIdleWithoutCountingADelivery(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := rawClient(t, srv)
	ctx := testCtx(t)
	const stream, group = "justid", "g"
	if err := c.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	id := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"k", "v"}}).Val()
	if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c1", Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	before, _ := pendingOf(t, c, stream, group, id)
	if before.Idle < time.Second || before.RetryCount != 1 || before.Consumer != "c1" {
		t.Fatalf("before refresh: %+v, want idle >= 1s, 1 delivery, owner c1", before)
	}

	if err := c.XClaimJustID(ctx, &redis.XClaimArgs{Stream: stream, Group: group, Consumer: "c1", MinIdle: 0, Messages: []string{id}}).Err(); err != nil {
		t.Fatal(err)
	}
	after, _ := pendingOf(t, c, stream, group, id)
	if after.Idle >= before.Idle/2 || after.RetryCount != 1 || after.Consumer != "c1" {
		t.Fatalf("after XCLAIM JUSTID: %+v (before %+v), want idle reset, still 1 delivery, owner c1", after, before)
	}

	if err := c.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: group, Consumer: "c1", MinIdle: 0, Messages: []string{id}}).Err(); err != nil {
		t.Fatal(err)
	}
	full, _ := pendingOf(t, c, stream, group, id)
	if full.RetryCount != 2 {
		t.Fatalf("after XCLAIM without JUSTID: %+v, want 2 deliveries", full)
	}
}

// The refresh script never takes an entry back from a peer that claimed it,
// and reports it as lost; entries still owned are refreshed.
func TestRefreshScriptDoesNotStealFromPeers(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := rawClient(t, srv)
	ctx := testCtx(t)
	const stream, group = "steal", "g"
	if err := c.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	mine := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"k", "1"}}).Val()
	taken := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"k", "2"}}).Val()
	if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "me", Streams: []string{stream, ">"}, Count: 2}).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	// A peer claims the second entry, as the idle claim would.
	if err := c.XClaimJustID(ctx, &redis.XClaimArgs{Stream: stream, Group: group, Consumer: "peer", MinIdle: 0, Messages: []string{taken}}).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	acked := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"k", "3"}}).Val()
	if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "me", Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	c.XAck(ctx, stream, group, acked)
	res, err := redisbroker.RefreshScript.Run(ctx, c, []string{stream}, group, "me", mine, "me", taken, "me", acked).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res) != fmt.Sprintf("[[%s] [%s]]", taken, acked) {
		t.Fatalf("script reply = %v, want [[%s] [%s]] (taken by a peer, no longer pending)", res, taken, acked)
	}
	p, _ := pendingOf(t, c, stream, group, taken)
	if p.Consumer != "peer" || p.Idle < 500*time.Millisecond || p.RetryCount != 1 {
		t.Fatalf("peer's entry after refresh: %+v, want untouched (owner peer, idle >= 500ms, 1 delivery)", p)
	}
	p, _ = pendingOf(t, c, stream, group, mine)
	if p.Consumer != "me" || p.Idle >= 500*time.Millisecond || p.RetryCount != 1 {
		t.Fatalf("own entry after refresh: %+v, want owner me, idle reset, 1 delivery", p)
	}
}

// Two subscribers of one group (peers), MaxIdleTime 2 s, handlers taking
// 6 s, more messages than handler slots (so some wait in upstream's
// read-ahead). With the keep-alive every message runs exactly once; without
// it, peers claim busy entries and messages run twice.
func TestIdleClaimWithAndWithoutKeepAlive(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const work = 6 * time.Second
	run := func(t *testing.T, keepAlive bool) (c *counter, want []string, peers []*redisbroker.Subscriber) {
		cfg := testConfig(srv)
		cfg.Consumers = 2
		cfg.MaxIdleTime = 2 * time.Second
		cfg.ClaimInterval = 200 * time.Millisecond
		cfg.KeepAlive = redisbroker.KeepAliveConfig{Interval: 400 * time.Millisecond, Disabled: !keepAlive}
		topic := uniq("slow")
		c = newCounter()
		handler := func(msg *message.Message) error {
			c.add(msg.UUID)
			select {
			case <-time.After(work):
				return nil
			case <-msg.Context().Done():
				return msg.Context().Err()
			}
		}
		for _, name := range []string{"a", "b"} {
			pc := cfg
			pc.Consumer = cfg.Consumer + name
			sub := newSubscriber(t, pc)
			peers = append(peers, sub)
			runRouter(t, sub, topic, handler)
		}
		want = ids("m", 6) // 4 slots, 2 messages wait in read-ahead
		publish(t, newPublisher(t, cfg), topic, want...)
		return c, want, peers
	}

	t.Run("with keep-alive", func(t *testing.T) {
		t.Parallel()
		c, want, peers := run(t, true)
		waitFor(t, "every message handled", 60*time.Second, func() bool { return len(c.missing(want)) == 0 })
		// The last ones started at about 6 s; wait for them to finish and
		// then past another MaxIdleTime + claim interval: no duplicate may
		// appear.
		waitFor(t, "all entries acked", 60*time.Second, func() bool {
			return peers[0].Stats().Tracked+peers[1].Stats().Tracked == 0
		})
		time.Sleep(3 * time.Second)
		if got := c.total(); got != len(want) {
			t.Fatalf("handled %d times for %d messages: the keep-alive let peers claim busy entries", got, len(want))
		}
		var refreshed uint64
		for _, p := range peers {
			refreshed += p.Stats().Refreshed
		}
		if refreshed == 0 {
			t.Fatal("no entry was ever refreshed")
		}
	})
	t.Run("without keep-alive", func(t *testing.T) {
		t.Parallel()
		c, want, _ := run(t, false)
		waitFor(t, "a duplicate run", 60*time.Second, func() bool { return c.total() > len(want) })
	})
}

// A handler stuck past KeepAlive.MaxInFlight is let go: a peer claims the
// entry MaxIdleTime later and runs it, while the stuck one still holds it.
func TestKeepAliveLetsGoOfStuckWork(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.MaxIdleTime = 2 * time.Second
	cfg.ClaimInterval = 200 * time.Millisecond
	cfg.KeepAlive = redisbroker.KeepAliveConfig{Interval: 400 * time.Millisecond, MaxInFlight: 3 * time.Second}
	topic := uniq("stuck")

	stuckCfg := cfg
	stuckCfg.Consumer = cfg.Consumer + "-stuck"
	stuck := newSubscriber(t, stuckCfg)
	started := make(chan time.Time, 1)
	runRouter(t, stuck, topic, func(msg *message.Message) error {
		select {
		case started <- time.Now():
		default:
		}
		<-msg.Context().Done() // stuck until shutdown
		return msg.Context().Err()
	})
	publish(t, newPublisher(t, cfg), topic, "job")
	var t0 time.Time
	select {
	case t0 = <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the stuck handler never got the message")
	}

	peerCfg := cfg
	peerCfg.Consumer = cfg.Consumer + "-peer"
	peer := newSubscriber(t, peerCfg)
	took := make(chan time.Time, 1)
	runRouter(t, peer, topic, func(msg *message.Message) error {
		select {
		case took <- time.Now():
		default:
		}
		return nil
	})
	select {
	case t1 := <-took:
		// Kept alive until MaxInFlight, then idle for MaxIdleTime.
		if d := t1.Sub(t0); d < cfg.KeepAlive.MaxInFlight {
			t.Fatalf("peer took the entry after %s, before MaxInFlight (%s): the keep-alive did not hold it", d, cfg.KeepAlive.MaxInFlight)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no peer took over the stuck entry")
	}
	// Presumed stuck, the consumer does not claim the entry back itself.
	if s := stuck.Stats(); s.Expired != 1 || s.Refreshed == 0 {
		t.Fatalf("stuck subscriber's keep-alive: %+v, want 1 expiry after some refreshes", s)
	}
}

// An entry claimed away from a busy subscriber by a peer (here: by hand) is
// reported lost and not taken back.
func TestKeepAliveReportsEntriesClaimedAway(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.KeepAlive.Interval = 200 * time.Millisecond
	topic := uniq("lost")
	sub := newSubscriber(t, cfg)
	got := make(chan redisbroker.Entry, 1)
	runRouter(t, sub, topic, func(msg *message.Message) error {
		e, _ := redisbroker.EntryOf(msg)
		got <- e
		<-msg.Context().Done()
		return msg.Context().Err()
	})
	publish(t, newPublisher(t, cfg), topic, "x")
	var e redisbroker.Entry
	select {
	case e = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	if e.Stream != topic || e.Group != cfg.ConsumerGroup || e.Consumer != cfg.Consumer || e.ID == "" {
		t.Fatalf("entry = %+v", e)
	}
	c := rawClient(t, srv)
	if err := c.XClaimJustID(context.Background(), &redis.XClaimArgs{Stream: topic, Group: cfg.ConsumerGroup, Consumer: "thief", MinIdle: 0, Messages: []string{e.ID}}).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the keep-alive to notice", 30*time.Second, func() bool { return sub.Stats().Lost == 1 })
	time.Sleep(500 * time.Millisecond) // a few more ticks
	if p, _ := pendingOf(t, c, topic, cfg.ConsumerGroup, e.ID); p.Consumer != "thief" {
		t.Fatalf("owner = %q, want thief: the keep-alive took the entry back", p.Consumer)
	}
}

// A consumer presumed stuck lets go of everything it holds, but the
// entries it read ahead and never handed over did not run here: their
// delivery is taken back (count one lower), owner and idle time unchanged,
// while the entry its handler is stuck on keeps its count. So a payload
// that hangs one consumer after another does not drag the entries queued
// behind it to MaxDeliveries (issue 34, item 2).
func TestStuckConsumerGivesBackUnstartedDeliveries(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := rawClient(t, srv)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.MaxIdleTime = 10 * time.Second // no claim in this test
	cfg.KeepAlive = redisbroker.KeepAliveConfig{Interval: 200 * time.Millisecond, MaxInFlight: 500 * time.Millisecond}
	topic := uniq("giveback")

	sub := newSubscriber(t, cfg)
	started := make(chan struct{}, 1)
	runRouter(t, sub, topic, func(msg *message.Message) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-msg.Context().Done() // stuck until shutdown
		return msg.Context().Err()
	})
	pub := newPublisher(t, cfg)
	publish(t, pub, topic, "stuck")
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never got the message")
	}
	publish(t, pub, topic, "behind-1", "behind-2") // read ahead, never handed over
	ctx := context.Background()
	var pending []redis.XPendingExt
	waitFor(t, "three entries pending for the consumer", 10*time.Second, func() bool {
		var err error
		pending, err = rc.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: topic, Group: cfg.ConsumerGroup, Start: "-", End: "+", Count: 10}).Result()
		return err == nil && len(pending) == 3
	})
	waitFor(t, "the stuck consumer to let go", 10*time.Second, func() bool { return sub.Stats().Expired == 3 })
	waitFor(t, "the read-ahead's deliveries to be taken back", 2*time.Second, func() bool {
		p, _ := pendingOf(t, rc, topic, cfg.ConsumerGroup, pending[2].ID)
		return p.RetryCount == 0
	})
	stuck, _ := pendingOf(t, rc, topic, cfg.ConsumerGroup, pending[0].ID)
	if stuck.RetryCount != 1 || stuck.Consumer != pending[0].Consumer {
		t.Errorf("entry in the stuck handler: %+v, want delivered once, same owner", stuck)
	}
	for _, want := range pending[1:] {
		p, ok := pendingOf(t, rc, topic, cfg.ConsumerGroup, want.ID)
		if !ok || p.RetryCount != 0 || p.Consumer != want.Consumer {
			t.Errorf("read-ahead entry: %+v, want delivered 0 times, same owner %s", p, want.Consumer)
		}
		// Refreshed with the stuck one until the same tick, so idle as
		// long: the give-back did not restart its idle clock (a peer
		// claims it on the same schedule).
		if d := stuck.Idle - p.Idle; d > 100*time.Millisecond || d < -100*time.Millisecond {
			t.Errorf("read-ahead entry idle %s, stuck entry idle %s: the give-back reset the idle time", p.Idle, stuck.Idle)
		}
	}
}
