package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/telemetry"
)

// kafkaBackend runs handlers as watermill-kafka consumer groups, built by
// a [kafkabroker.Cluster].
type kafkaBackend struct {
	cfg     KafkaConfig
	cluster *kafkabroker.Cluster
	pub     *kafka.Publisher
}

func newKafkaBackend(cfg KafkaConfig, logger watermill.LoggerAdapter, o options, c control) (*kafkaBackend, error) {
	kopts := []kafkabroker.Option{kafkabroker.WithTracer(o.tracer), kafkabroker.WithSaramaConfig(o.saramaConfig)}
	if c.noRevocation {
		kopts = append(kopts, kafkabroker.WithObserveOnly())
	}
	cl, err := kafkabroker.Open(cfg, logger, kopts...)
	if err != nil {
		return nil, kafkaError(err)
	}
	pub, err := cl.NewPublisher()
	if err != nil {
		_ = cl.Close()
		return nil, kafkaError(err)
	}
	return &kafkaBackend{cfg: cfg, cluster: cl, pub: pub}, nil
}

// kafkaError turns kafkabroker's configuration errors into FieldErrors
// under kafka., and prefixes anything else.
func kafkaError(err error) error {
	if errors.Is(err, spillway.ErrInvalidConfig) {
		return errors.Join(nested("kafka.", err)...)
	}
	return fmt.Errorf("router: kafka: %w", err)
}

// Brokers returns the bootstrap addresses the router's Kafka clients use:
// the configured ones, or the embedded broker's loopback address. Nil for
// other brokers.
func (r *Router) Brokers() []string {
	if b, ok := r.back.(*kafkaBackend); ok {
		return b.cluster.Brokers()
	}
	return nil
}

// isRedelivery reports whether msg is a broker redelivery: on Kafka, a
// message at or below the offset an earlier session of this router had
// already received for its partition
// ([kafkabroker.SessionTracker.Redelivered]). The retry gate sheds such
// work before fresh work while the consumer is saturated, and coalescing
// never lets it supersede. False for deliveries no session tracker knows.
func (r *Router) isRedelivery(msg *message.Message) bool {
	if r.cfg.Broker == BrokerRedis {
		return redisRedelivery(msg)
	}
	if t, ok := r.tracker(message.HandlerNameFromCtx(msg.Context())).(*kafkabroker.SessionTracker); ok && t != nil {
		return t.Redelivered(msg)
	}
	return false
}

func (b *kafkaBackend) group(handler string) string { return b.cfg.ConsumerGroup + "." + handler }

func (b *kafkaBackend) publisher() message.Publisher { return b.pub }

// subscriber builds the handler's subscriber in the mode kafka.consumer
// names: watermill-kafka's (partition) or a [kafkabroker.KeySubscriber]
// (key). Both come with a [kafkabroker.SessionTracker].
func (b *kafkaBackend) subscriber(handler, _ string) (message.Subscriber, deliveryTracker, error) {
	if b.cfg.Consumer == kafkabroker.ConsumerKey {
		sub, tr, err := b.cluster.NewKeySubscriber(b.group(handler))
		if err != nil {
			return nil, nil, kafkaError(err)
		}
		return sub, tr, nil
	}
	sub, tr, err := b.cluster.NewSubscriber(b.group(handler))
	if err != nil {
		return nil, nil, kafkaError(err)
	}
	return sub, tr, nil
}

func (b *kafkaBackend) ensureTopic(topic string) error {
	if err := b.cluster.EnsureTopic(topic); err != nil {
		return kafkaError(err)
	}
	return nil
}

// lag reads each handler group's lag per partition (the high-water mark
// minus the committed offset; a partition never committed counts from its
// oldest retained offset), one source per handler, built on first use over
// the cluster's shared client.
func (b *kafkaBackend) lag(ctx context.Context, groups []groupTopic) ([]telemetry.LagSample, error) {
	var out []telemetry.LagSample
	for _, g := range groups {
		src, err := b.cluster.LagSource(b.group(g.handler), g.topic)
		if err != nil {
			return nil, kafkaError(err)
		}
		samples, err := src.Lag(ctx)
		if err != nil {
			return nil, fmt.Errorf("router: kafka: lag: %w", err)
		}
		out = append(out, samples...)
	}
	return out, nil
}

func (b *kafkaBackend) deadLetter(func(*message.Message, bool)) message.HandlerMiddleware { return nil }

func (b *kafkaBackend) system() string { return "kafka" }

func (b *kafkaBackend) close() error { return b.cluster.Close() }

// keyWindows calls f with the session tracker of every handler of the
// router that runs on Kafka in consumer key, and the handler's consumer
// group; the tracker reports each partition's window and read-ahead. It
// calls f for nothing unless the router runs on Kafka in consumer key.
func (r *Router) keyWindows(f func(group string, kt *kafkabroker.SessionTracker)) {
	b, isKafka := r.back.(*kafkaBackend)
	if !isKafka || b.cfg.Consumer != kafkabroker.ConsumerKey {
		return
	}
	m := r.trackers.Load()
	if m == nil {
		return
	}
	for handler, t := range *m {
		if kt, isKT := t.(*kafkabroker.SessionTracker); isKT {
			f(b.group(handler), kt)
		}
	}
}
