package kafkabroker_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// TestEdgeKafkaPublisherWaitsForAllReplicas: the publisher, which also
// publishes the retry, dead-letter and audit copies before the original is
// acked, waits for every in-sync replica and, from Kafka 0.11, is
// idempotent (with what Sarama needs for that: one request in flight per
// connection, retries on).
func TestEdgeKafkaPublisherWaitsForAllReplicas(t *testing.T) {
	for _, version := range []string{"", "2.3.0", "0.11.0.0"} {
		c, err := kafkabroker.Config{Brokers: []string{"k1:9092"}, Version: version}.SaramaPublisherConfig()
		if err != nil {
			t.Fatalf("version %q: %v", version, err)
		}
		if c.Producer.RequiredAcks != sarama.WaitForAll {
			t.Errorf("version %q: RequiredAcks = %v, want WaitForAll", version, c.Producer.RequiredAcks)
		}
		if !c.Producer.Idempotent || c.Net.MaxOpenRequests != 1 || c.Producer.Retry.Max < 1 {
			t.Errorf("version %q: idempotent %v, max open requests %d, retries %d; want an idempotent producer",
				version, c.Producer.Idempotent, c.Net.MaxOpenRequests, c.Producer.Retry.Max)
		}
	}
	// Before 0.11 there is no idempotent producer; all replicas are still
	// waited for.
	c, err := kafkabroker.Config{Brokers: []string{"k1:9092"}, Version: "0.10.2.0"}.SaramaPublisherConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.Producer.RequiredAcks != sarama.WaitForAll || c.Producer.Idempotent {
		t.Errorf("0.10.2: RequiredAcks %v, idempotent %v; want WaitForAll, not idempotent", c.Producer.RequiredAcks, c.Producer.Idempotent)
	}
}

// TestEdgeKafkaIdempotentPublishRoundTrip: the durable publisher works
// against the embedded broker's protocol (kfake, Kafka 2.3.0): published
// messages are consumed back, each once.
func TestEdgeKafkaIdempotentPublishRoundTrip(t *testing.T) {
	broker := kafkatest.Start(t, 1)
	cl, err := kafkabroker.New(kafkabroker.Config{
		Brokers: broker.Brokers(), Version: "2.3.0", Partitions: 1, CreateTopics: true,
		HeartbeatInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.EnsureTopic("copies"); err != nil {
		t.Fatal(err)
	}
	pub, err := cl.NewPublisher()
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range 3 {
		if err := pub.Publish("copies", message.NewMessage(string(rune('a'+i)), []byte("x"))); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	sub, _, err := cl.NewSubscriber("g")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "copies")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		select {
		case m := <-msgs:
			if want := string(rune('a' + i)); m.UUID != want {
				t.Errorf("message %d is %s, want %s", i, m.UUID, want)
			}
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("got %d of 3 messages", i)
		}
	}
}

// warnLogger records error-level log lines.
type warnLogger struct {
	watermill.NopLogger
	mu    sync.Mutex
	lines []string
}

func (l *warnLogger) Error(msg string, _ error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, msg+" "+watermill.LogFields(fields).Copy()["topic"].(string))
}

func (l *warnLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// count returns how many replication-factor warnings name topic.
func (l *warnLogger) count(topic string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, "replication factor 1") && strings.HasSuffix(s, " "+topic) {
			n++
		}
	}
	return n
}

// TestEdgeKafkaReplicationFactorOneWarns: on an external cluster a topic
// with a single replica is reported, once per topic, whether Spillway
// created it or found it.
func TestEdgeKafkaReplicationFactorOneWarns(t *testing.T) {
	broker := kafkatest.Start(t, 1, "existing")
	for _, create := range []bool{true, false} {
		log := &warnLogger{}
		cl, err := kafkabroker.New(kafkabroker.Config{
			Brokers: broker.Brokers(), Version: "2.3.0", Partitions: 1, CreateTopics: create,
		}, kafkabroker.WithLogger(log))
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := cl.EnsureTopic("existing"); err != nil {
				t.Fatal(err)
			}
		}
		if n := log.count("existing"); n != 1 {
			t.Errorf("create_topics %v: %d warnings about topic existing, want 1 (%q)", create, n, log.lines)
		}
		if create {
			if err := cl.EnsureTopic("created.dead_letter"); err != nil {
				t.Fatal(err)
			}
			if n := log.count("created.dead_letter"); n != 1 {
				t.Errorf("%d warnings about a topic created with one replica, want 1 (%q)", n, log.lines)
			}
		}
		_ = cl.Close()
	}
}

// TestEdgeKafkaRedeliveryMarked: a message that an earlier session of the
// same cluster and consumer group had already received is a redelivery; a
// message first received now is not, and neither is the same offset in
// another group.
func TestEdgeKafkaRedeliveryMarked(t *testing.T) {
	broker := kafkatest.Start(t, 1, "positions")
	cl, err := kafkabroker.New(kafkabroker.Config{
		Brokers: broker.Brokers(), Version: "2.3.0", Partitions: 1,
		HeartbeatInterval: 100 * time.Millisecond, NackResendSleep: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pub, err := cl.NewPublisher()
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range 4 {
		if err := pub.Publish("positions", message.NewMessage(string(rune('a'+i)), []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type got struct {
		uuid        string
		redelivered bool
	}
	// receive takes n messages from a new subscriber of group; it acks all
	// but the last unless ackLast, then closes the subscriber.
	receive := func(group string, n int, ackLast bool) []got {
		sub, tr, err := cl.NewSubscriber(group)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		msgs, err := sub.Subscribe(ctx, "positions")
		if err != nil {
			t.Fatal(err)
		}
		var out []got
		for i := range n {
			select {
			case m := <-msgs:
				out = append(out, got{m.UUID, tr.Redelivered(m)})
				if i < n-1 || ackLast {
					m.Ack()
				}
			case <-ctx.Done():
				t.Fatalf("group %s: got %d of %d messages", group, i, n)
			}
		}
		return out
	}
	first := receive("g", 2, false) // a acked, b received and left unacked
	if want := []got{{"a", false}, {"b", false}}; !slices.Equal(first, want) {
		t.Errorf("first session: %v, want %v", first, want)
	}
	second := receive("g", 3, true) // b again, then c and d
	if want := []got{{"b", true}, {"c", false}, {"d", false}}; !slices.Equal(second, want) {
		t.Errorf("second session: %v, want %v", second, want)
	}
	other := receive("other", 1, true)
	if want := []got{{"a", false}}; !slices.Equal(other, want) {
		t.Errorf("another group: %v, want %v", other, want)
	}
}
