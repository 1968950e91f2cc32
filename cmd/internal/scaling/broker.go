package scaling

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-go/spillway/cmd/internal/redisproc"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// ErrNoRedisServer says why the Redis part of a sweep is skipped.
var ErrNoRedisServer = errors.New("redis-server is not on PATH (apt-get install redis-server): the Redis Streams part of the sweep is skipped")

// kafkaVersion is the protocol version every client speaks: the newest
// Sarama and kfake agree on (the router's choice for an embedded
// broker, docs/kafka.md).
var kafkaVersion = sarama.V2_3_0_0

// publishKafka writes msgs to topic in batches, with nil keys (Sarama's
// hash partitioner then spreads them over the partitions at random).
func publishKafka(brokers []string, topic string, msgs []*message.Message) error {
	c := kafka.DefaultSaramaSyncPublisherConfig()
	c.Version = kafkaVersion
	// Producer.MaxMessageBytes stays at Sarama's 1 MB, which also caps a
	// record batch: the broker's limit.
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	p, err := sarama.NewSyncProducer(brokers, c)
	if err != nil {
		return fmt.Errorf("scaling: producer: %w", err)
	}
	defer p.Close()
	m := kafka.DefaultMarshaler{}
	const batch = 200
	for i := 0; i < len(msgs); i += batch {
		pm := make([]*sarama.ProducerMessage, 0, batch)
		for _, msg := range msgs[i:min(i+batch, len(msgs))] {
			km, err := m.Marshal(topic, msg)
			if err != nil {
				return err
			}
			pm = append(pm, km)
		}
		if err := p.SendMessages(pm); err != nil {
			var pe sarama.ProducerErrors
			if errors.As(err, &pe) && len(pe) > 0 {
				err = fmt.Errorf("%w (first: %w)", err, pe[0].Err)
			}
			return fmt.Errorf("scaling: publishing to %s: %w", topic, err)
		}
	}
	return nil
}

// redisServer is a real redis-server on a free loopback port, without
// persistence.
type redisServer struct {
	*redisproc.Server
	addr   string
	client *redis.Client
}

func startRedis() (*redisServer, error) {
	srv, err := redisproc.Start("spillway-bench-redis-", "--maxclients", "4096")
	if errors.Is(err, redisproc.ErrNotFound) {
		return nil, ErrNoRedisServer
	}
	if err != nil {
		return nil, fmt.Errorf("scaling: %w", err)
	}
	return &redisServer{Server: srv, addr: srv.Addr, client: srv.Client}, nil
}

// flush empties the server between cells.
func (s *redisServer) flush(ctx context.Context) error { return s.client.FlushAll(ctx).Err() }

func (s *redisServer) close() { s.Close() }
