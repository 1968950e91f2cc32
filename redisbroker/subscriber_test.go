package redisbroker_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/embedreg"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// Consumers subscriptions give that many handlers at once: the concurrency
// a vertex budget governs.
func TestConsumersRunHandlersConcurrently(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 4
	topic := uniq("fanin")
	sub := newSubscriber(t, cfg)
	var inFlight, peak atomic.Int64
	release := make(chan struct{})
	c := newCounter()
	runRouter(t, sub, topic, func(msg *message.Message) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		c.add(msg.UUID)
		return nil
	})
	want := ids("f", 12)
	publish(t, newPublisher(t, cfg), topic, want...)
	waitFor(t, "four handlers at once", 30*time.Second, func() bool { return inFlight.Load() == 4 })
	time.Sleep(200 * time.Millisecond)
	if p := peak.Load(); p != 4 {
		t.Fatalf("peak concurrency = %d, want exactly Consumers (4)", p)
	}
	close(release)
	waitFor(t, "all messages", 30*time.Second, func() bool { return len(c.missing(want)) == 0 })
	consumers := map[string]bool{}
	for _, n := range sub.Consumers() {
		consumers[n] = true
	}
	if len(consumers) != 4 || !consumers[cfg.Consumer+"-0"] || !consumers[cfg.Consumer+"-3"] {
		t.Fatalf("consumers = %v", sub.Consumers())
	}
}

// Every delivered message names its entry; metadata set by a producer under
// the reserved keys is replaced.
func TestEntryMetadata(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	topic := uniq("meta")
	sub := newSubscriber(t, cfg)
	ch := subscribe(t, sub, topic)
	m := message.NewMessage("m", []byte("x"))
	m.Metadata.Set(redisbroker.MetadataEntryID, "forged")
	m.Metadata.Set(redisbroker.MetadataConsumer, "forged")
	m.Metadata.Set("app", "kept")
	pub := newPublisher(t, cfg)
	if err := pub.Publish(topic, m); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-ch:
		e, ok := redisbroker.EntryOf(got)
		if !ok || e.Stream != topic || e.Group != cfg.ConsumerGroup || e.ID == "forged" || e.Consumer == "forged" {
			t.Fatalf("entry = %+v, %v", e, ok)
		}
		if got.Metadata.Get("app") != "kept" {
			t.Fatalf("metadata = %v", got.Metadata)
		}
		got.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	if _, ok := redisbroker.EntryOf(message.NewMessage("other", nil)); ok {
		t.Fatal("EntryOf found an entry on a foreign message")
	}
}

// A nacked message is redelivered (to the same consumer) with a context
// that ends with the subscription: upstream's redelivered copy has none.
func TestNackedMessageContextEndsOnClose(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.NackResendSleep = -1
	topic := uniq("nackctx")
	sub, err := redisbroker.NewSubscriber(cfg, redisbroker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, newPublisher(t, cfg), topic, "n")
	(<-ch).Nack()
	var again *message.Message
	select {
	case again = <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("not redelivered")
	}
	if again.UUID != "n" {
		t.Fatalf("redelivered %s", again.UUID)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-again.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the redelivered message's context did not end with the subscriber")
	}
	if _, err := sub.Subscribe(context.Background(), topic); !errors.Is(err, spillway.ErrClosed) {
		t.Fatalf("Subscribe after Close: %v", err)
	}
	if err := sub.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, ok := <-ch; ok {
		t.Fatal("channel still open")
	}
}

// Approximate MAXLEN at publish: the oldest entries are trimmed, per topic
// or by default; 0 for a topic means unbounded.
func TestMaxLenTrimsOldest(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	bounded, override, unbounded := uniq("bounded"), uniq("override"), uniq("unbounded")
	cfg.DefaultMaxLen = 100
	cfg.MaxLen = map[string]int64{override: 300, unbounded: 0}
	pub := newPublisher(t, cfg)
	for _, topic := range []string{bounded, override, unbounded} {
		msgs := make([]*message.Message, 1000)
		for i := range msgs {
			msgs[i] = message.NewMessage(topic+"-"+ids("", 1000)[i], []byte("x"))
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	raw := rawClient(t, srv)
	ctx := testCtx(t)
	check := func(topic string, lo, hi int64) {
		n, err := raw.XLen(ctx, topic).Result()
		if err != nil || n < lo || n > hi {
			t.Errorf("XLEN %s = %d, %v; want in [%d, %d]", topic, n, err, lo, hi)
		}
		first, _ := raw.XRangeN(ctx, topic, "-", "+", 1).Result()
		last, _ := raw.XRevRangeN(ctx, topic, "+", "-", 1).Result()
		if len(first) == 0 || len(last) == 0 || last[0].Values["_watermill_message_uuid"] != topic+"--999" {
			t.Errorf("%s: newest entry lost", topic)
		}
		if n < 1000 && first[0].Values["_watermill_message_uuid"] == topic+"--000" {
			t.Errorf("%s: trimmed, but not from the oldest end", topic)
		}
	}
	// Approximate trimming removes whole radix-tree nodes (100 entries by
	// default), so a stream keeps at least MAXLEN and less than MAXLEN+100.
	check(bounded, 100, 199)
	check(override, 300, 399)
	check(unbounded, 1000, 1000)
}

// Addr "embedded" is a validation error until a server is registered (the
// embedded package does that for miniredis); once one is, the publisher
// and subscriber share it and the keep-alive script runs there too. Here a
// real redis-server stands in for the registered server.
func TestEmbedded(t *testing.T) {
	cfg := redisbroker.Config{
		Addr:          spillway.Embedded,
		ConsumerGroup: "g",
		Consumer:      "demo",
		Consumers:     2,
		BlockTime:     20 * time.Millisecond,
		MaxIdleTime:   time.Second,
		KeepAlive:     redisbroker.KeepAliveConfig{Interval: 100 * time.Millisecond},
	}
	if err := cfg.Validate(); !errors.Is(err, spillway.ErrEmbeddedNotLinked) || !strings.Contains(err.Error(), "spillway/embedded") {
		t.Fatalf("Validate with nothing registered: %v, want ErrEmbeddedNotLinked naming the import", err)
	}
	if _, err := redisbroker.NewPublisher(cfg); !errors.Is(err, spillway.ErrEmbeddedNotLinked) {
		t.Fatalf("NewPublisher with nothing registered: %v, want ErrEmbeddedNotLinked", err)
	}
	srv := redistest.Start(t)
	var started atomic.Int32
	embedreg.RegisterRedis(func() (string, func(), error) {
		started.Add(1)
		return srv.Addr(), func() {}, nil
	})
	t.Cleanup(func() { embedreg.RegisterRedis(nil) })

	topic := "embedded"
	sub := newSubscriber(t, cfg)
	c := newCounter()
	runRouter(t, sub, topic, func(msg *message.Message) error {
		time.Sleep(300 * time.Millisecond) // long enough for a refresh tick
		c.add(msg.UUID)
		return nil
	})
	want := ids("e", 4)
	publish(t, newPublisher(t, cfg), topic, want...)
	waitFor(t, "messages through the embedded server", 30*time.Second, func() bool { return len(c.missing(want)) == 0 })
	if s := sub.Stats(); s.Refreshed == 0 || s.RefreshErrors != 0 {
		t.Fatalf("keep-alive on the embedded server: %+v", s)
	}
	if n := started.Load(); n != 1 {
		t.Fatalf("embedded server started %d times, want once for every client of the process", n)
	}
}
