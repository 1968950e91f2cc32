package autoscale

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cmd/internal/kafkaproc"
	"github.com/spillway-go/spillway/cmd/internal/redisproc"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/telemetry/kafkatel"
)

// The brokers the experiment runs on.
const (
	BrokerKafka = "kafka" // the embedded kfake broker, in a child process
	BrokerRedis = "redis" // a real redis-server
)

// ErrNoRedisServer says why the Redis runs are skipped.
var ErrNoRedisServer = errors.New("redis-server is not on PATH (apt-get install redis-server): the Redis Streams runs are skipped")

// broker is one running broker: where workers find it, how the stream is
// published to it and how a KEDA-like scaler reads a group's lag.
type broker struct {
	name  string
	kafka *kafkaproc.Broker
	redis *redisproc.Server
	// client serves the lag reads and the producer on Kafka.
	client   sarama.Client
	producer sarama.SyncProducer
}

// startBroker starts name with the topics (Kafka: partitions each).
func startBroker(name string, partitions int, topics []string) (*broker, error) {
	b := &broker{name: name}
	switch name {
	case BrokerKafka:
		k, err := kafkaproc.Start(partitions, topics)
		if err != nil {
			return nil, err
		}
		b.kafka = k
		c := kafka.DefaultSaramaSyncPublisherConfig()
		c.Version = kafkaVersion
		c.Metadata.Retry.Backoff = 250 * time.Millisecond
		client, err := sarama.NewClient(k.Brokers, c)
		if err != nil {
			k.Close()
			return nil, fmt.Errorf("autoscale: kafka client: %w", err)
		}
		b.client = client
		p, err := sarama.NewSyncProducerFromClient(client)
		if err != nil {
			b.close()
			return nil, fmt.Errorf("autoscale: kafka producer: %w", err)
		}
		b.producer = p
	case BrokerRedis:
		srv, err := redisproc.Start("spillway-autoscale-redis-", "--maxclients", "4096")
		if errors.Is(err, redisproc.ErrNotFound) {
			return nil, ErrNoRedisServer
		}
		if err != nil {
			return nil, fmt.Errorf("autoscale: %w", err)
		}
		b.redis = srv
	default:
		return nil, fmt.Errorf("autoscale: unknown broker %q", name)
	}
	return b, nil
}

func (b *broker) close() {
	if b.producer != nil {
		_ = b.producer.Close()
	}
	if b.client != nil {
		_ = b.client.Close()
	}
	if b.kafka != nil {
		b.kafka.Close()
	}
	if b.redis != nil {
		b.redis.Close()
	}
}

// pid is the broker process's id.
func (b *broker) pid() int {
	if b.kafka != nil {
		return b.kafka.Pid()
	}
	return b.redis.Pid()
}

// cpuSeconds is the broker process's user+system CPU time so far, from
// /proc (0 where there is none).
func (b *broker) cpuSeconds() float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", b.pid()))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses.
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ is 100 on Linux
}

// publish writes items to topic, each stamped with its vertex count and
// producedAt. On Kafka the message id is the key, so the spread over the
// partitions is the same every time.
func (b *broker) publish(ctx context.Context, topic string, items []Item, producedAt time.Time) error {
	msgs := make([]*message.Message, len(items))
	for i, it := range items {
		m := message.NewMessage(it.ID, it.Body)
		m.Metadata.Set("vertex_count", strconv.Itoa(it.Vertices))
		m.Metadata.Set(producedAtKey, strconv.FormatInt(producedAt.UnixNano(), 10))
		msgs[i] = m
	}
	const batch = 200
	if b.name == BrokerKafka {
		marshal := kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) { return m.UUID, nil })
		for i := 0; i < len(msgs); i += batch {
			var pm []*sarama.ProducerMessage
			for _, m := range msgs[i:min(i+batch, len(msgs))] {
				km, err := marshal.Marshal(topic, m)
				if err != nil {
					return err
				}
				pm = append(pm, km)
			}
			if err := b.producer.SendMessages(pm); err != nil {
				return fmt.Errorf("autoscale: publishing to %s: %w", topic, err)
			}
		}
		return nil
	}
	if err := b.redis.Publish(ctx, topic, msgs); err != nil {
		return fmt.Errorf("autoscale: %w", err)
	}
	return nil
}

// lag reads group's backlog on topic in messages, as KEDA's scalers do:
// on Kafka the high-water mark minus the committed offset of every
// partition (kafkatel's lag source, the same reads as KEDA's Kafka
// scaler); on Redis XINFO GROUPS, the group's lag plus its pending
// entries (the stream's length before the group exists).
func (b *broker) lag(ctx context.Context, topic, group string) (int64, error) {
	if b.name == BrokerKafka {
		src, err := kafkatel.NewLagSource(b.client, group, topic)
		if err != nil {
			return 0, err
		}
		samples, err := src(ctx)
		if err != nil {
			return 0, err
		}
		return totalLag(samples), nil
	}
	groups, err := b.redis.Client.XInfoGroups(ctx, topic).Result()
	if err != nil && !strings.Contains(err.Error(), "no such key") {
		return 0, err
	}
	for _, g := range groups {
		if g.Name == group {
			if g.Lag < 0 { // Redis cannot tell: count from the stream
				n, err := b.redis.Client.XLen(ctx, topic).Result()
				return max(n-g.EntriesRead, 0) + g.Pending, err
			}
			return g.Lag + g.Pending, nil
		}
	}
	n, err := b.redis.Client.XLen(ctx, topic).Result()
	if err != nil && strings.Contains(err.Error(), "no such key") {
		return 0, nil
	}
	return n, err
}

func totalLag(samples []telemetry.LagSample) int64 {
	var n int64
	for _, s := range samples {
		n += max(s.Lag, 0)
	}
	return n
}
