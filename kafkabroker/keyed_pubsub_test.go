package kafkabroker_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// initializing makes the suite create each topic before it subscribes.
type initializing struct {
	message.Subscriber
	cl *kafkabroker.Cluster
}

func (s initializing) SubscribeInitialize(topic string) error { return s.cl.EnsureTopic(topic) }

// TestKeyPubSubSuite runs Watermill's universal pub/sub tests on consumer
// key, for the features it has: consumer groups and persistence.
// Delivery is at least once, and order holds per key, not per topic (the
// publisher keys every message by its UUID here), so the ordered and
// exactly-once variants do not apply; neither does the broker restart.
func TestKeyPubSubSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("Watermill's universal suite: about a minute")
	}
	broker := kafkatest.Start(t, 4)
	cl, err := kafkabroker.New(kafkabroker.Config{
		Brokers:           broker.Brokers(),
		Version:           "2.3.0",
		Partitions:        4,
		CreateTopics:      true,
		Consumer:          kafkabroker.ConsumerKey,
		HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  3 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := cl.NewPublisher()
		if err != nil {
			t.Fatal(err)
		}
		sub, _, err := cl.NewSubscriber(group)
		if err != nil {
			t.Fatal(err)
		}
		return pub, initializing{sub, cl}
	}
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups: true,
		Persistent:     true,
	}, func(t *testing.T) (message.Publisher, message.Subscriber) { return withGroup(t, "test") }, withGroup)
}

// TestKeyPubSubSuiteOrdered runs the suite's ordered tests as well: on
// one partition, messages published without a key (watermill-kafka's
// default marshaler) share the partition's order, so the subscriber
// hands them over one at a time, in order.
func TestKeyPubSubSuiteOrdered(t *testing.T) {
	if testing.Short() {
		t.Skip("Watermill's universal suite: about a minute")
	}
	broker := kafkatest.Start(t, 1)
	cl, err := kafkabroker.New(kafkabroker.Config{
		Brokers:           broker.Brokers(),
		Version:           "2.3.0",
		Partitions:        1,
		CreateTopics:      true,
		Consumer:          kafkabroker.ConsumerKey,
		HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  3 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pcfg := kafka.DefaultSaramaSyncPublisherConfig()
		pcfg.Version = sarama.V2_3_0_0
		pub, err := kafka.NewPublisher(kafka.PublisherConfig{
			Brokers:               broker.Brokers(),
			Marshaler:             kafka.DefaultMarshaler{}, // no key
			OverwriteSaramaConfig: pcfg,
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sub, _, err := cl.NewSubscriber(group)
		if err != nil {
			t.Fatal(err)
		}
		return pub, initializing{sub, cl}
	}
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:  true,
		Persistent:      true,
		GuaranteedOrder: true,
	}, func(t *testing.T) (message.Publisher, message.Subscriber) { return withGroup(t, "test") }, withGroup)
}
