package kafkatel

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/spillway-go/spillway/telemetry"
)

// Attributes returns the Kafka attributes of a message consumed through
// watermill-kafka: messaging.destination.partition.id,
// messaging.kafka.offset and messaging.kafka.message.key (when the message
// has a key), read from the message context. It returns nothing for
// messages from other subscribers. Pass it to telemetry.WithAttributes
// together with telemetry.WithMessagingSystem("kafka").
func Attributes(msg *message.Message) []attribute.KeyValue {
	ctx := msg.Context()
	p, ok := kafka.MessagePartitionFromCtx(ctx)
	if !ok {
		return nil
	}
	attrs := make([]attribute.KeyValue, 0, 3)
	attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(int(p))))
	if off, ok := kafka.MessagePartitionOffsetFromCtx(ctx); ok {
		attrs = append(attrs, semconv.MessagingKafkaOffset(int(off)))
	}
	if key, ok := kafka.MessageKeyFromCtx(ctx); ok && len(key) > 0 {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(string(key)))
	}
	return attrs
}

// lagSource is the source [NewLagSource] returns.
type lagSource struct {
	client sarama.Client
	admin  sarama.ClusterAdmin
	group  string
	topics []string
}

// NewLagSource returns a source of group's lag on topics, using client
// (whose Config.Version must be at least 0.10.1, for OffsetFetch v2 and
// ListOffsets v1): for every partition, the high-water mark minus the
// group's committed offset. A partition where the group has committed
// nothing yet counts everything still retained (high-water mark minus the
// oldest offset) as lag.
//
// Each Lag call costs one OffsetFetch to the group's coordinator and one
// ListOffsets per partition (two for partitions without a commit); run it
// from a telemetry.LagSampler, never per message. Sarama calls cannot be
// cancelled: the context is checked between requests, and each request is
// bounded by the client's Net timeouts. The source is safe for concurrent
// use and does not close the client.
//
// NewLagSource fails if no topic is given or the cluster controller cannot
// be reached.
func NewLagSource(client sarama.Client, group string, topics ...string) (telemetry.LagSource, error) {
	if client == nil {
		return nil, errors.New("kafkatel: nil client")
	}
	if group == "" || len(topics) == 0 {
		return nil, errors.New("kafkatel: a group and at least one topic are required")
	}
	// The admin shares the client; closing the admin would close it, so
	// the source never does.
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("kafkatel: cluster admin: %w", err)
	}
	src := &lagSource{client: client, admin: admin, group: group, topics: append([]string(nil), topics...)}
	return src.lag, nil
}

// lag returns one sample per partition of every topic.
func (s *lagSource) lag(ctx context.Context) ([]telemetry.LagSample, error) {
	parts := make(map[string][]int32, len(s.topics))
	n := 0
	for _, topic := range s.topics {
		ps, err := s.client.Partitions(topic)
		if err != nil {
			return nil, fmt.Errorf("kafkatel: partitions of %q: %w", topic, err)
		}
		parts[topic] = ps
		n += len(ps)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// Committed offsets first, then high-water marks: read in this order a
	// concurrent commit can only make the lag look larger, never negative.
	committed, err := s.fetchCommitted(parts)
	if err != nil {
		return nil, err
	}

	out := make([]telemetry.LagSample, 0, n)
	for _, topic := range s.topics {
		for _, p := range parts[topic] {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			hwm, err := s.client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return nil, fmt.Errorf("kafkatel: high-water mark of %s/%d: %w", topic, p, err)
			}
			from, ok := committed[topicPartition{topic, p}]
			if !ok {
				if from, err = s.client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
					return nil, fmt.Errorf("kafkatel: oldest offset of %s/%d: %w", topic, p, err)
				}
			}
			out = append(out, telemetry.LagSample{Topic: topic, Group: s.group, Partition: p, Lag: max(hwm-from, 0)})
		}
	}
	return out, nil
}

type topicPartition struct {
	topic     string
	partition int32
}

// fetchCommitted returns the committed offset of every partition that has
// one. A coordinator that moved is looked up again once.
func (s *lagSource) fetchCommitted(parts map[string][]int32) (map[topicPartition]int64, error) {
	resp, err := s.admin.ListConsumerGroupOffsets(s.group, parts)
	if errors.Is(err, sarama.ErrGroupIDNotFound) {
		// Sarama returns the broker's answer for a group that has never
		// committed as an error (see below).
		return map[topicPartition]int64{}, nil
	}
	if err == nil && (resp.Err == sarama.ErrNotCoordinatorForConsumer || resp.Err == sarama.ErrConsumerCoordinatorNotAvailable) {
		err = resp.Err
	}
	if err != nil {
		if rerr := s.client.RefreshCoordinator(s.group); rerr != nil {
			return nil, fmt.Errorf("kafkatel: offsets of group %q: %w", s.group, err)
		}
		if resp, err = s.admin.ListConsumerGroupOffsets(s.group, parts); err != nil {
			return nil, fmt.Errorf("kafkatel: offsets of group %q: %w", s.group, err)
		}
	}
	out := make(map[topicPartition]int64)
	switch resp.Err {
	case sarama.ErrNoError:
	case sarama.ErrGroupIDNotFound:
		// Some brokers say so for a group that has never committed; Kafka
		// answers with offset -1 instead. Either way: nothing committed.
		return out, nil
	default:
		return nil, fmt.Errorf("kafkatel: offsets of group %q: %w", s.group, resp.Err)
	}
	for topic, ps := range parts {
		for _, p := range ps {
			b := resp.GetBlock(topic, p)
			if b == nil {
				continue
			}
			if b.Err == sarama.ErrGroupIDNotFound {
				continue
			}
			if b.Err != sarama.ErrNoError {
				return nil, fmt.Errorf("kafkatel: committed offset of %s/%d: %w", topic, p, b.Err)
			}
			if b.Offset >= 0 {
				out[topicPartition{topic, p}] = b.Offset
			}
		}
	}
	return out, nil
}
