package router

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/telemetry/kafkatel"
)

// kafkaBackend runs handlers as watermill-kafka consumer groups, built by
// a [kafkabroker.Cluster].
type kafkaBackend struct {
	cfg     kafkabroker.Config
	cluster *kafkabroker.Cluster
	pub     *kafka.Publisher

	mu         sync.Mutex
	trackers   map[string]*kafkabroker.SessionTracker // by handler name
	lagSources map[groupTopic]telemetry.LagSource
}

func newKafkaBackend(cfg kafkabroker.Config, logger watermill.LoggerAdapter, o options) (*kafkaBackend, error) {
	kopts := append([]kafkabroker.Option{kafkabroker.WithLogger(logger)}, o.kafka...)
	cl, err := kafkabroker.New(cfg, kopts...)
	if err != nil {
		return nil, kafkaError(err)
	}
	pub, err := cl.NewPublisher()
	if err != nil {
		_ = cl.Close()
		return nil, kafkaError(err)
	}
	return &kafkaBackend{
		cfg: cfg, cluster: cl, pub: pub,
		trackers:   make(map[string]*kafkabroker.SessionTracker),
		lagSources: make(map[groupTopic]telemetry.LagSource),
	}, nil
}

// kafkaError turns kafkabroker's configuration errors into FieldErrors
// under kafka., and prefixes anything else.
func kafkaError(err error) error {
	if errors.Is(err, spillway.ErrInvalidConfig) {
		return errors.Join(nested("kafka.", err)...)
	}
	return fmt.Errorf("router: kafka: %w", err)
}

// isRedelivery reports whether msg is a broker redelivery: on Kafka, a
// message at or below the offset an earlier session of this router had
// already received for its partition
// ([kafkabroker.SessionTracker.Redelivered]); on Redis, an entry delivered
// before. The retry gate sheds such work before fresh work while the
// consumer is saturated, and coalescing never lets it supersede. False for
// deliveries no session tracker knows.
func (r *Router) isRedelivery(msg *message.Message) bool {
	return r.back.redelivered(msg, r.tracker(message.HandlerNameFromCtx(msg.Context())))
}

func (b *kafkaBackend) group(handler string) string { return b.cfg.ConsumerGroup + "." + handler }

func (b *kafkaBackend) publisher() message.Publisher { return b.pub }

// subscriber builds the handler's subscriber in the mode kafka.consumer
// names (partition or key), with its [kafkabroker.SessionTracker].
func (b *kafkaBackend) subscriber(handler, _ string) (message.Subscriber, deliveryTracker, error) {
	sub, tr, err := b.cluster.NewSubscriber(b.group(handler))
	if err != nil {
		return nil, nil, kafkaError(err)
	}
	b.mu.Lock()
	b.trackers[handler] = tr
	b.mu.Unlock()
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
// oldest retained offset), one kafkatel source per handler and topic, built
// on first use over the cluster's shared client.
func (b *kafkaBackend) lag(ctx context.Context, groups []groupTopic) ([]telemetry.LagSample, error) {
	var out []telemetry.LagSample
	for _, g := range groups {
		src, err := b.lagSource(g)
		if err != nil {
			return nil, err
		}
		samples, err := src(ctx)
		if err != nil {
			return nil, fmt.Errorf("router: kafka: lag: %w", err)
		}
		out = append(out, samples...)
	}
	return out, nil
}

// lagSource returns the lag source of g's group and topic, built once.
// The cluster's client fails after Close, and so does this.
func (b *kafkaBackend) lagSource(g groupTopic) (telemetry.LagSource, error) {
	client, err := b.cluster.Client()
	if err != nil {
		return nil, kafkaError(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if src := b.lagSources[g]; src != nil {
		return src, nil
	}
	src, err := kafkatel.NewLagSource(client, b.group(g.handler), g.topic)
	if err != nil {
		return nil, fmt.Errorf("router: kafka: lag: %w", err)
	}
	b.lagSources[g] = src
	return src, nil
}

func (b *kafkaBackend) deadLetter(func(*message.Message, bool)) message.HandlerMiddleware { return nil }

func (b *kafkaBackend) system() string { return "kafka" }

func (b *kafkaBackend) close() error { return b.cluster.Close() }

// redelivered asks the handler's session tracker whether an earlier session
// of this router had already received msg.
func (b *kafkaBackend) redelivered(msg *message.Message, tr deliveryTracker) bool {
	return tr != nil && tr.Redelivered(msg)
}

func (b *kafkaBackend) useCopies(message.Publisher) {}

// addStats sums the session trackers' late marks and evictions.
func (b *kafkaBackend) addStats(s *Stats) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, kt := range b.trackers {
		s.LateMarks += kt.LateMarks()
		s.Evictions += kt.Evictions()
	}
}

func (b *kafkaBackend) keepAlive() (redisbroker.SubscriberStats, bool) {
	return redisbroker.SubscriberStats{}, false
}

func (b *kafkaBackend) started() {}

// owned keeps the samples of partitions a handler's tracker owns now.
func (b *kafkaBackend) owned(samples []telemetry.LagSample) []telemetry.LagSample {
	b.mu.Lock()
	byGroup := make(map[string]*kafkabroker.SessionTracker, len(b.trackers))
	for handler, tr := range b.trackers {
		byGroup[b.group(handler)] = tr
	}
	b.mu.Unlock()
	var out []telemetry.LagSample
	for _, s := range samples {
		if tr := byGroup[s.Group]; tr != nil && tr.Owns(s.Topic, s.Partition) {
			out = append(out, s)
		}
	}
	return out
}

// keyWindows calls f with the session tracker of every handler and the
// handler's consumer group, in consumer key only; the tracker reports each
// partition's window and read-ahead.
func (b *kafkaBackend) keyWindows(f func(group string, kt *kafkabroker.SessionTracker)) {
	if b.cfg.Consumer != kafkabroker.ConsumerKey {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for handler, kt := range b.trackers {
		f(b.group(handler), kt)
	}
}
