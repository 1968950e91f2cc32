package redisbroker_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// Malformed entries added with a raw XADD go to the dead-letter stream
// without reaching the handler; the subscription keeps going (upstream would
// end it at the first one).
func TestMalformedEntriesAreDeadLettered(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.DeadLetterTopic = uniq("dead")
	topic := uniq("poison")
	sub := newSubscriber(t, cfg)
	pub := newPublisher(t, cfg)
	dl, err := redisbroker.NewDeadLetter(cfg, redisbroker.WithPublisher(pub))
	if err != nil {
		t.Fatal(err)
	}
	c := newCounter()
	runRouter(t, sub, topic, func(msg *message.Message) error {
		if redisbroker.IsMalformed(msg) {
			t.Errorf("malformed message %s reached the handler", msg.UUID)
		}
		c.add(msg.UUID)
		return nil
	}, dl.Middleware)

	raw := rawClient(t, srv)
	ctx := testCtx(t)
	publish(t, pub, topic, "good-1")
	noUUID := raw.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: []string{"foo", "bar", "bin", "\xff\xfe"}}).Val()
	badMeta := raw.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: []string{"_watermill_message_uuid", "bad-meta", "metadata", "\xc1not msgpack", "payload", "x"}}).Val()
	// A well-formed message claiming to be malformed is not believed.
	spoof := message.NewMessage("spoof", []byte("x"))
	spoof.Metadata.Set(redisbroker.MetadataMalformed, "1")
	spoof.Metadata.Set(redisbroker.MetadataEntryID, "0-1")
	if err := pub.Publish(topic, spoof); err != nil {
		t.Fatal(err)
	}
	publish(t, pub, topic, "good-2")

	want := []string{"good-1", "spoof", "good-2"}
	waitFor(t, "the good messages", 30*time.Second, func() bool { return len(c.missing(want)) == 0 })
	waitFor(t, "two dead letters", 30*time.Second, func() bool { return dl.Count() == 2 })
	if n := sub.Stats().Malformed; n != 2 {
		t.Fatalf("Malformed = %d, want 2", n)
	}
	if c.total() != len(want) {
		t.Fatalf("handler ran %d times, want %d", c.total(), len(want))
	}

	// The dead-letter stream holds both, with everything the entries held.
	entries, err := raw.XRange(ctx, cfg.DeadLetterTopic, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Fatalf("dead-letter stream has %d entries, want 2", len(entries))
	}
	dlSubCfg := cfg
	dlSubCfg.ConsumerGroup = uniq("dlreader")
	dlSub := newSubscriber(t, dlSubCfg)
	msgs, err := dlSub.Subscribe(ctx, cfg.DeadLetterTopic)
	if err != nil {
		t.Fatal(err)
	}
	bySource := map[string]redisbroker.MalformedEntry{}
	for range 2 {
		select {
		case m := <-msgs:
			if redisbroker.IsMalformed(m) {
				t.Fatal("a dead letter reads back as malformed")
			}
			var me redisbroker.MalformedEntry
			if err := json.Unmarshal(m.Payload, &me); err != nil {
				t.Fatal(err)
			}
			if m.Metadata.Get(redisbroker.MetadataDeadLetterSource) != topic || m.Metadata.Get(redisbroker.MetadataDeadLetterID) != me.ID ||
				m.Metadata.Get(redisbroker.MetadataDeadLetterReason) == "" {
				t.Fatalf("dead letter metadata = %v", m.Metadata)
			}
			bySource[me.ID] = me
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatal("dead letters not readable")
		}
	}
	if me := bySource[noUUID]; me.Fields["foo"] != "bar" || me.FieldsBase64["bin"] != "//4=" || me.Stream != topic || me.Error == "" {
		t.Fatalf("dead letter for the entry without UUID = %+v", me)
	}
	if me := bySource[badMeta]; me.Fields["_watermill_message_uuid"] != "bad-meta" || !strings.Contains(me.Error, "metadata") {
		t.Fatalf("dead letter for the entry with bad metadata = %+v", me)
	}
}

// When the dead-letter publish fails the message is nacked, not dropped,
// and the handler still never runs.
func TestDeadLetterPublishFailureNacks(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.NackResendSleep = 20 * time.Millisecond
	topic := uniq("poison-nack")
	sub := newSubscriber(t, cfg)
	failing := &flakyPublisher{failures: 3, pub: newPublisher(t, cfg)}
	dl, err := redisbroker.NewDeadLetter(redisbroker.Config{DeadLetterTopic: uniq("dead")}, redisbroker.WithPublisher(failing))
	if err != nil {
		t.Fatal(err)
	}
	ran := newCounter()
	runRouter(t, sub, topic, func(msg *message.Message) error { ran.add(msg.UUID); return nil }, dl.Middleware)
	raw := rawClient(t, srv)
	raw.XAdd(context.Background(), &redis.XAddArgs{Stream: topic, Values: []string{"junk", "1"}})
	waitFor(t, "the dead letter to be published after failures", 30*time.Second, func() bool { return dl.Count() == 1 })
	if failing.calls() != 4 {
		t.Fatalf("publish attempts = %d, want 4 (3 failures, then success)", failing.calls())
	}
	if ran.total() != 0 {
		t.Fatal("the handler ran on a malformed message")
	}
}

type flakyPublisher struct {
	pub      message.Publisher
	failures int
	mu       sync.Mutex
	n        int
}

func (f *flakyPublisher) Publish(topic string, msgs ...*message.Message) error {
	f.mu.Lock()
	f.n++
	n := f.n
	f.mu.Unlock()
	if n <= f.failures {
		return errors.New("dead-letter stream unavailable")
	}
	return f.pub.Publish(topic, msgs...)
}

func (f *flakyPublisher) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func (f *flakyPublisher) Close() error { return nil }

// NewDeadLetter needs WithPublisher, and defaults the topic.
func TestNewDeadLetterNeedsPublisher(t *testing.T) {
	_, err := redisbroker.NewDeadLetter(redisbroker.Config{})
	var fe *spillway.FieldError
	if !errors.Is(err, spillway.ErrInvalidConfig) || !errors.As(err, &fe) || fe.Field != "WithPublisher" {
		t.Fatalf("err = %v, want a FieldError on WithPublisher", err)
	}
	dl, err := redisbroker.NewDeadLetter(redisbroker.Config{}, redisbroker.WithPublisher(&flakyPublisher{}))
	if err != nil || dl.Topic() != redisbroker.DefaultDeadLetterTopic {
		t.Fatalf("dl = %v, %v", dl, err)
	}
}
