package redisbroker_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// pendingIDs returns the IDs of the entries pending in group on stream.
func pendingIDs(t testing.TB, c *redis.Client, stream, group string) []string {
	t.Helper()
	p, err := c.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: group, Start: "-", End: "+", Count: 1000}).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(p))
	for i := range p {
		out[i] = p[i].ID
	}
	sort.Strings(out)
	return out
}

// noMessage fails if msgs delivers a message within d.
func noMessage(t testing.TB, msgs <-chan *message.Message, d time.Duration, why string) {
	t.Helper()
	select {
	case msg := <-msgs:
		t.Fatalf("%s: got %s", why, msg.UUID)
	case <-time.After(d):
	}
}

// With Window 3, one consumer hands over three messages before any is
// acked, and no fourth until one is settled. Every one of them stays
// pending in Redis until its own ack: an ack removes exactly that entry,
// and what is not acked when the subscriber closes stays pending.
func TestWindowHandsOverSeveralAndKeepsThemPending(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.Window = 3
	topic := uniq("window")
	publish(t, newPublisher(t, cfg), topic, ids("m", 5)...)
	sub := newSubscriber(t, cfg)
	msgs := subscribe(t, sub, topic)
	c := rawClient(t, srv)

	var held []*message.Message
	for range 3 {
		held = append(held, receive(t, msgs))
	}
	noMessage(t, msgs, 500*time.Millisecond, "a fourth message while three are out")
	if p := pendingIDs(t, c, topic, cfg.ConsumerGroup); len(p) < 3 {
		t.Fatalf("pending = %v, want the three handed over (and read-ahead)", p)
	}

	first, _ := redisbroker.EntryOf(held[0])
	held[0].Ack()
	fourth := receive(t, msgs)
	waitFor(t, "the XACK of the acked message", 10*time.Second, func() bool {
		_, pending := pendingOf(t, c, topic, cfg.ConsumerGroup, first.ID)
		return !pending
	})
	for _, msg := range append(held[1:], fourth) {
		e, _ := redisbroker.EntryOf(msg)
		if _, pending := pendingOf(t, c, topic, cfg.ConsumerGroup, e.ID); !pending {
			t.Errorf("%s (%s) is no longer pending although it was never acked", msg.UUID, e.ID)
		}
	}

	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	for _, msg := range append(held[1:], fourth) {
		e, _ := redisbroker.EntryOf(msg)
		if _, pending := pendingOf(t, c, topic, cfg.ConsumerGroup, e.ID); !pending {
			t.Errorf("%s (%s) was acknowledged by Close without an ack", msg.UUID, e.ID)
		}
	}
}

// A nacked message of a window is handed over again as a new delivery
// while the others stay out; messages acked just before Close all reach
// Redis.
func TestWindowNackAndAckBeforeClose(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.Window = 16
	cfg.NackResendSleep = 10 * time.Millisecond
	topic := uniq("window-nack")
	publish(t, newPublisher(t, cfg), topic, ids("m", 16)...)
	sub := newSubscriber(t, cfg)
	msgs := subscribe(t, sub, topic)
	c := rawClient(t, srv)

	var held []*message.Message
	for range 16 {
		held = append(held, receive(t, msgs))
	}
	a := held[0]
	a.Nack()
	again := receive(t, msgs)
	if again.UUID != a.UUID || again == a {
		t.Fatalf("after a nack got %s (same message: %v), want a new delivery of %s", again.UUID, again == a, a.UUID)
	}
	if n := redisbroker.Deliveries(again); n != 2 {
		t.Errorf("Deliveries after a nack = %d, want 2", n)
	}
	held[0] = again
	for _, msg := range held {
		msg.Ack()
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if p := pendingIDs(t, c, topic, cfg.ConsumerGroup); len(p) != 0 {
		t.Errorf("pending after every message was acked and the subscriber closed: %v", p)
	}
}

// The keep-alive covers every message a window holds: three messages held
// unacked for more than twice MaxIdleTime are not claimed by a peer
// reading the same group.
func TestWindowHeldMessagesKeptAlive(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.Window = 3
	cfg.MaxIdleTime = time.Second
	cfg.ClaimInterval = 100 * time.Millisecond
	topic := uniq("window-ka")
	publish(t, newPublisher(t, cfg), topic, ids("m", 3)...)
	sub := newSubscriber(t, cfg)
	msgs := subscribe(t, sub, topic)
	held := []*message.Message{receive(t, msgs), receive(t, msgs), receive(t, msgs)}

	peerCfg := cfg
	peerCfg.Consumer = uniq("peer")
	peer := newSubscriber(t, peerCfg)
	noMessage(t, subscribe(t, peer, topic), 2500*time.Millisecond, "the peer claimed a held message")
	for _, msg := range held {
		if ch := sub.Revoked(msg); ch == nil {
			t.Errorf("Revoked(%s) = nil for a held message", msg.UUID)
		} else {
			select {
			case <-ch:
				t.Errorf("%s revoked while kept alive", msg.UUID)
			default:
			}
		}
		msg.Ack()
	}
	c := rawClient(t, srv)
	waitFor(t, "the acks", 10*time.Second, func() bool { return len(pendingIDs(t, c, topic, cfg.ConsumerGroup)) == 0 })
}

// A consumer that keeps acking other messages of its window does not keep
// one that makes no progress alive forever: after KeepAlive.MaxInFlight
// that message is revoked on its own and counted as expired, so a peer
// can claim it.
func TestWindowMessageExpiresOnItsOwn(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.Window = 2
	cfg.MaxIdleTime = 3 * time.Second
	cfg.KeepAlive.Interval = 200 * time.Millisecond
	cfg.KeepAlive.MaxInFlight = time.Second
	topic := uniq("window-expire")
	pub := newPublisher(t, cfg)
	publish(t, pub, topic, "stuck")
	sub := newSubscriber(t, cfg)
	msgs := subscribe(t, sub, topic)
	stuck := receive(t, msgs)
	revoked := sub.Revoked(stuck)
	if revoked == nil {
		t.Fatal("Revoked = nil")
	}
	// The other slot keeps acking: the consumer makes progress.
	deadline := time.Now().Add(4 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		publish(t, pub, topic, ids("flow", i+1)[i])
		receive(t, msgs).Ack()
		select {
		case <-revoked:
			if n := sub.Stats().Expired; n != 1 {
				t.Errorf("Expired = %d, want 1", n)
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatal("the message held without progress was never let go while its consumer kept acking others")
}

// Revocation reaches a message of a window: when a peer claims its entry,
// Revoked closes for that message only, and its ack (the message stepped
// aside, never completed) leaves the entry pending for the peer.
func TestWindowHeldMessageRevoked(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.Window = 2
	cfg.MaxIdleTime = 3 * time.Second
	cfg.KeepAlive.Interval = 200 * time.Millisecond
	topic := uniq("window-revoke")
	publish(t, newPublisher(t, cfg), topic, ids("m", 2)...)
	sub := newSubscriber(t, cfg)
	msgs := subscribe(t, sub, topic)
	taken, kept := receive(t, msgs), receive(t, msgs)
	takenCh, keptCh := sub.Revoked(taken), sub.Revoked(kept)
	if takenCh == nil || keptCh == nil {
		t.Fatal("Revoked = nil for a held message")
	}
	e, _ := redisbroker.EntryOf(taken)
	c := rawClient(t, srv)
	if err := c.XClaim(context.Background(), &redis.XClaimArgs{
		Stream: topic, Group: cfg.ConsumerGroup, Consumer: "peer", Messages: []string{e.ID},
	}).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-takenCh:
	case <-time.After(5 * time.Second):
		t.Fatal("the claimed message was not revoked")
	}
	select {
	case <-keptCh:
		t.Fatal("the other message of the window was revoked too")
	default:
	}
	taken.Ack()
	kept.Ack()
	k, _ := redisbroker.EntryOf(kept)
	waitFor(t, "the XACK of the kept message", 10*time.Second, func() bool {
		_, pending := pendingOf(t, c, topic, cfg.ConsumerGroup, k.ID)
		return !pending
	})
	if p, pending := pendingOf(t, c, topic, cfg.ConsumerGroup, e.ID); !pending || p.Consumer != "peer" {
		t.Errorf("claimed entry: pending %v, owner %q; want it left pending for the peer", pending, p.Consumer)
	}
}
