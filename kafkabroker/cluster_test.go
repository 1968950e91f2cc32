package kafkabroker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/telemetry/kafkatel"
)

// TestClusterRoundTrip: a Cluster on a broker address creates topics,
// publishes keyed messages, consumes them in a group through a subscriber
// with a session tracker, reports the group's lag, and calls the Sarama
// hook last on every configuration it builds.
func TestClusterRoundTrip(t *testing.T) {
	broker := kafkatest.Start(t, 2)
	cfg := kafkabroker.Config{
		Brokers:           broker.Brokers(),
		Version:           "2.3.0", // kfake's limit
		Partitions:        2,
		CreateTopics:      true,
		Topics:            []string{"up-front"},
		HeartbeatInterval: 100 * time.Millisecond,
	}
	var (
		mu    sync.Mutex
		kinds = map[string]int{}
	)
	hook := func(c *sarama.Config) error {
		// Called after Spillway's settings.
		if c.ClientID != kafkabroker.DefaultClientID || c.Version != sarama.V2_3_0_0 {
			t.Errorf("hook ran before the section was applied: client id %q, version %v", c.ClientID, c.Version)
		}
		kind := "admin"
		switch {
		case c.Consumer.Group.Heartbeat.Interval == 100*time.Millisecond:
			kind = "subscriber"
		case c.Producer.Return.Successes:
			kind = "publisher"
		}
		mu.Lock()
		kinds[kind]++
		mu.Unlock()
		c.ClientID = "from-hook"
		return nil
	}
	cl, err := kafkabroker.New(cfg, kafkabroker.WithSaramaConfig(hook))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.EnsureTopic("geo"); err != nil {
		t.Fatal(err)
	}
	pub, err := cl.NewPublisher()
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range 4 {
		m := message.NewMessage(string(rune('a'+i)), []byte(`{"type":"Point","coordinates":[1,2]}`))
		m.Metadata.Set("entity_id", "e1")
		if err := pub.Publish("geo", m); err != nil {
			t.Fatal(err)
		}
	}
	client, err := cl.Client()
	if err != nil {
		t.Fatal(err)
	}
	src, err := kafkatel.NewLagSource(client, cfg.WithDefaults().ConsumerGroup+".h", "geo")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	samples, err := src(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, s := range samples {
		total += s.Lag
	}
	if total != 4 {
		t.Errorf("lag before consuming = %d, want 4 (%+v)", total, samples)
	}

	sub, tr, err := cl.NewSubscriber(cfg.WithDefaults().ConsumerGroup + ".h")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "geo")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		select {
		case m := <-msgs:
			if tr.Revoked(m) == nil {
				t.Errorf("message %d: the tracker does not know its session", i)
			}
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("got %d of 4 messages", i)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range []string{"admin", "publisher", "subscriber"} {
		if kinds[k] == 0 {
			t.Errorf("hook never called for the %s configuration (%v)", k, kinds)
		}
	}
}

// TestNewHookError: an error from the Sarama hook fails New.
func TestNewHookError(t *testing.T) {
	errNo := errors.New("no")
	_, err := kafkabroker.New(kafkabroker.Config{Brokers: []string{"127.0.0.1:1"}},
		kafkabroker.WithSaramaConfig(func(*sarama.Config) error { return errNo }))
	if !errors.Is(err, errNo) {
		t.Errorf("New = %v, want the hook's error", err)
	}
	_, err = kafkabroker.New(kafkabroker.Config{Brokers: []string{"127.0.0.1:1"}},
		kafkabroker.WithSaramaConfig(func(c *sarama.Config) error { c.ChannelBufferSize = -1; return nil }))
	if err == nil {
		t.Error("New accepted a configuration Sarama rejects")
	}
}

// TestNewInvalid: New validates.
func TestNewInvalid(t *testing.T) {
	_, err := kafkabroker.New(kafkabroker.Config{})
	var fe *spillway.FieldError
	if !errors.As(err, &fe) || fe.Field != "brokers" {
		t.Errorf("New without brokers = %v", err)
	}
}
