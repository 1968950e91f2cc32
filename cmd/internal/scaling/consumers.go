package scaling

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/router"
)

// target is the broker of a cell and its topics, one per handler.
type target struct {
	broker      string
	kafka       []string // bootstrap addresses
	redisAddr   string
	parallelism int
	topics      []string
}

// consumer is a router built for one run.
type consumer struct {
	run   func(context.Context) error
	close func() error
}

// handlerFor returns handler j's function.
type handlerFor func(j int) message.NoPublishHandlerFunc

// handlerName names handler j of a run.
func handlerName(j int) string { return fmt.Sprintf("h%d", j) }

// newBare wires the bare upstream subscriber under Watermill's own router:
// on Kafka one watermill-kafka subscriber per handler, on Redis Streams
// t.parallelism watermill-redisstream subscribers per handler (upstream
// reads one message at a time per subscriber), each with the settings the
// Spillway router gives its own.
func newBare(t target, group string, h handlerFor) (*consumer, error) {
	wm, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	for j, topic := range t.topics {
		name := handlerName(j)
		if t.broker == BrokerKafka {
			sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
				Brokers:               t.kafka,
				Unmarshaler:           kafka.DefaultMarshaler{},
				OverwriteSaramaConfig: BareSaramaConfig(),
				ConsumerGroup:         group + "." + name,
			}, watermill.NopLogger{})
			if err != nil {
				_ = wm.Close()
				return nil, err
			}
			wm.AddConsumerHandler(name, topic, sub, h(j))
			continue
		}
		rc := redisbroker.Config{Addr: t.redisAddr, ConsumerGroup: group}.WithDefaults()
		for i := range t.parallelism {
			sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client:          redis.NewClient(&redis.Options{Addr: t.redisAddr}), // the subscriber closes it
				Consumer:        fmt.Sprintf("c%d", i),
				ConsumerGroup:   group + "." + name,
				NackResendSleep: rc.NackResendSleep,
				BlockTime:       rc.BlockTime,
				ClaimInterval:   rc.ClaimInterval,
				MaxIdleTime:     rc.MaxIdleTime,
				OldestId:        "0",
				// So that Close returns: the first read otherwise blocks
				// until an entry arrives (the router sets it too).
				DisableIndefiniteInitialBlock: true,
			}, watermill.NopLogger{})
			if err != nil {
				_ = wm.Close()
				return nil, err
			}
			wm.AddConsumerHandler(fmt.Sprintf("%s-c%d", name, i), topic, sub, h(j))
		}
	}
	return &consumer{run: wm.Run, close: wm.Close}, nil
}

// BareSaramaConfig is watermill-kafka's DefaultSaramaSubscriberConfig with
// the settings the Spillway router's kafka section defaults to
// (docs/kafka.md): the same window, fetch size, group timeouts and start
// offset, so that the comparison is of the consumers alone.
func BareSaramaConfig() *sarama.Config {
	k := kafkabroker.Config{}.WithDefaults()
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Version = kafkaVersion
	c.ClientID = k.ClientID
	if rt := k.RebalanceTimeout + 5*time.Second; c.Net.ReadTimeout < rt {
		c.Net.ReadTimeout = rt
	}
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	c.ChannelBufferSize = k.ChannelBufferSize
	c.Consumer.Fetch.Default = k.FetchDefaultBytes
	c.Consumer.Return.Errors = true
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Group.Rebalance.Timeout = k.RebalanceTimeout
	c.Consumer.Group.Session.Timeout = k.SessionTimeout
	c.Consumer.Group.Heartbeat.Interval = k.HeartbeatInterval
	return c
}

// newSpillway builds the Spillway router with its defaults (telemetry on,
// no providers: OpenTelemetry's no-op globals and the lag sampler) and a
// vertex budget of budget, one handler per topic, except that the retry
// gate is off: the curve's handlers never fail, and the gate's cost per
// message is measured by the router's BenchmarkChain (the retry=on row),
// not here.
func newSpillway(t target, group string, budget int64, h handlerFor) (*consumer, error) {
	var cfg router.Config
	cfg.Retry.Disabled = true
	cfg.Budget.Vertices = budget
	cfg.CloseTimeout = 10 * time.Second
	switch t.broker {
	case BrokerKafka:
		cfg.Broker = "kafka"
		cfg.Kafka.Brokers = t.kafka
		cfg.Kafka.Version = kafkaVersion.String()
		cfg.Kafka.ConsumerGroup = group
		cfg.Kafka.Partitions = int32(t.parallelism)
	case BrokerRedis:
		cfg.Broker = "redis"
		cfg.Redis.Addr = t.redisAddr
		cfg.Redis.ConsumerGroup = group
		cfg.Redis.Consumer = "c"
		cfg.Redis.Consumers = t.parallelism
	}
	r, err := router.New(cfg, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	for j, topic := range t.topics {
		if _, err := r.AddConsumerHandler(handlerName(j), topic, h(j)); err != nil {
			_ = r.Close()
			return nil, err
		}
	}
	return &consumer{run: r.Run, close: r.Close}, nil
}
