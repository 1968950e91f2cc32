package redisbroker_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/redisbroker"

	"github.com/spillway-go/spillway/internal/redistest"
)

// A message acked just before Close is acknowledged in Redis (XACK) before
// the subscriber's connections go: Close never cancels an XACK that an Ack
// already asked for, so finished work is not redelivered (issue 13, item 4).
func TestEdgeAckThenClose(t *testing.T) {
	srv := redistest.Start(t)
	raw := rawClient(t, srv)
	const rounds = 40
	for i := range rounds {
		cfg := testConfig(srv)
		cfg.Consumers = 1
		topic := uniq("ack-close")
		publish(t, newPublisher(t, cfg), topic, "m")
		sub := newSubscriber(t, cfg)
		msg := receive(t, subscribe(t, sub, topic))
		msg.Ack()
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
		n, err := raw.XPending(testCtx(t), topic, cfg.ConsumerGroup).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n.Count != 0 {
			t.Fatalf("round %d: %d entries still pending after Ack then Close", i, n.Count)
		}
	}
}

// The default consumer name is unique to each process, even two of one
// program on one host, and to each subscriber of a process: two
// subscribers sharing a name would refresh, claim back and acknowledge
// each other's entries (issue 13, item 5).
func TestEdgeDefaultConsumerUniquePerProcess(t *testing.T) {
	if os.Getenv("SPILLWAY_PRINT_CONSUMER") == "1" {
		fmt.Print(redisbroker.DefaultConsumerName())
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestEdgeDefaultConsumerUniquePerProcess$")
	cmd.Env = append(os.Environ(), "SPILLWAY_PRINT_CONSUMER=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	other, mine := string(out), redisbroker.DefaultConsumerName()
	if other == "" || other == mine {
		t.Fatalf("two processes of one program on one host both default to consumer %q", mine)
	}
	if again := redisbroker.DefaultConsumerName(); again != mine {
		t.Errorf("default name changed within a process: %q then %q", mine, again)
	}

	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumer = ""
	a, b := newSubscriber(t, cfg), newSubscriber(t, cfg)
	if a.Config().Consumer == b.Config().Consumer {
		t.Errorf("two subscribers of one group in one process share the default consumer %q", a.Config().Consumer)
	}
}

// Entries carry Redis's delivery count: 1 when read for the first time,
// 2 once claimed from a consumer that died with it (issue 13, item 12).
func TestEdgeDeliveryCount(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.MaxIdleTime = time.Second
	cfg.ClaimInterval = 100 * time.Millisecond
	topic := uniq("deliveries")
	publish(t, newPublisher(t, cfg), topic, "m")

	first := newSubscriber(t, cfg)
	msg := receive(t, subscribe(t, first, topic))
	if n := redisbroker.Deliveries(msg); n != 1 {
		t.Fatalf("first delivery: Deliveries = %d, want 1", n)
	}
	_ = first.Close() // dies holding it

	cfg.Consumer = uniq("peer")
	peer := newSubscriber(t, cfg)
	msg = receive(t, subscribe(t, peer, topic)) // claimed from first
	if n := redisbroker.Deliveries(msg); n != 2 {
		t.Errorf("claimed delivery: Deliveries = %d, want 2", n)
	}
	if n := redisbroker.Deliveries(message.NewMessage("x", nil)); n != 0 {
		t.Errorf("Deliveries of a message from elsewhere = %d, want 0", n)
	}
	msg.Ack()
}

// A message whose entry the keep-alive gives up (KeepAlive.MaxInFlight)
// is revoked; if it then steps aside (acked without running, as the budget
// does), its entry is not acknowledged: it stays pending for a peer to
// claim, never lost (issue 13, item 5).
func TestEdgeRevokedAfterMaxInFlightStaysPending(t *testing.T) {
	srv := redistest.Start(t)
	raw := rawClient(t, srv)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.KeepAlive.Interval = 100 * time.Millisecond
	cfg.KeepAlive.MaxInFlight = 300 * time.Millisecond
	topic := uniq("revoke-stuck")
	publish(t, newPublisher(t, cfg), topic, "m")
	sub := newSubscriber(t, cfg)
	msg := receive(t, subscribe(t, sub, topic))
	revoked := sub.Revoked(msg)
	if revoked == nil {
		t.Fatal("Revoked returned nil for a live delivery")
	}
	select {
	case <-revoked:
	case <-time.After(10 * time.Second):
		t.Fatal("the delivery was not revoked after KeepAlive.MaxInFlight")
	}
	msg.Ack() // stepped aside
	id := msg.Metadata.Get(redisbroker.MetadataEntryID)
	time.Sleep(300 * time.Millisecond)
	if _, ok := pendingOf(t, raw, topic, cfg.ConsumerGroup, id); !ok {
		t.Fatal("a message that stepped aside was acknowledged: its entry is lost")
	}
	if st := sub.Stats(); st.Revoked != 1 {
		t.Errorf("Stats().Revoked = %d, want 1", st.Revoked)
	}
}

// A lost consumer group (recreated after NOGROUP) revokes every delivery
// the subscriber held: none of them is pending any more (issue 13, item 5).
func TestEdgeRevokedOnGroupRecreated(t *testing.T) {
	srv := redistest.Start(t)
	raw := rawClient(t, srv)
	cfg := testConfig(srv)
	topic := uniq("revoke-group")
	publish(t, newPublisher(t, cfg), topic, "m")
	sub := newSubscriber(t, cfg)
	msg := receive(t, subscribe(t, sub, topic))
	revoked := sub.Revoked(msg)
	if err := raw.XGroupDestroy(testCtx(t), topic, cfg.ConsumerGroup).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-revoked:
	case <-time.After(10 * time.Second):
		t.Fatal("the delivery was not revoked when the group was lost")
	}
	sub.Completed(msg)
	msg.Ack()
}

// Revoked answers for the message the subscriber handed over, not for the
// entry its metadata names: a message that copies a delivery's metadata
// (forged, or kept from an earlier attempt) gets no channel, and after a
// nack only the copy handed over again is watched.
func TestEdgeRevokedFollowsTheHandedMessage(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.NackResendSleep = -1
	topic := uniq("revoke-handed")
	publish(t, newPublisher(t, cfg), topic, "m")
	sub := newSubscriber(t, cfg)
	msgs := subscribe(t, sub, topic)
	msg := receive(t, msgs)
	if sub.Revoked(msg) == nil {
		t.Fatal("Revoked returned nil for the message handed over")
	}
	forged := message.NewMessage("forged", nil)
	for k, v := range msg.Metadata {
		forged.Metadata.Set(k, v)
	}
	if sub.Revoked(forged) != nil {
		t.Error("Revoked returned a channel for a message with a delivery's metadata that the subscriber never handed over")
	}
	msg.Nack()
	var again *message.Message
	select {
	case again = <-msgs:
	case <-time.After(10 * time.Second):
		t.Fatal("the nacked message was not handed over again")
	}
	if sub.Revoked(again) == nil {
		t.Error("Revoked returned nil for the copy handed over after the nack")
	}
	if sub.Revoked(msg) != nil {
		t.Error("Revoked returned a channel for the attempt the nack ended")
	}
	again.Ack()
}
