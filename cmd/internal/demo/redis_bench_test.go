package demo

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/router"
)

// BenchmarkRedisConsume is BenchmarkKafkaConsume on Redis Streams, on a
// real redis-server (internal/redistest): b.N small stamped entries
// appended to a fresh stream before the consumer starts, timed from the
// first message handled to the last, with a handler that does nothing.
// Compare the ratios within one run, per consumer count:
//
//	go test -run '^$' -bench RedisConsume -benchmem -count 6 ./internal/demo/
//
//	consumer=upstream       Watermill router + watermill-redisstream
//	                        subscribers (one per consumer, one consumer group,
//	                        the block time the Spillway router uses)
//	consumer=spillway       the Spillway router with redis.consumers set to
//	                        the same count: the redisbroker subscriber (entry
//	                        metadata, keep-alive, poison-safe unmarshalling)
//	                        plus the middleware stack, telemetry on as by
//	                        default (no providers, the lag sampler)
//	consumer=spillway-no-otel  the same with telemetry.disabled
//
// cpu-ns/msg is the CPU of this process (not redis-server's) per message.
func BenchmarkRedisConsume(b *testing.B) {
	srv := redistest.Start(b)
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	var seq atomic.Int64
	for _, consumers := range []int{1, 4} {
		for _, c := range []string{"upstream", "spillway", "spillway-no-otel"} {
			b.Run("consumers="+strconv.Itoa(consumers)+"/consumer="+c, func(b *testing.B) {
				topic := "bench-" + c + "-" + strconv.FormatInt(seq.Add(1), 10)
				fillRedis(b, raw, topic, b.N)
				benchRedisConsume(b, c, consumers, srv.Addr(), topic)
			})
		}
	}
}

// redisBlockTime is the redis section's default block_time, which the
// Spillway router reads with.
const redisBlockTime = 500 * time.Millisecond

// fillRedis appends n stamped entries to topic, pipelined, in the
// upstream marshaller's format (the one both consumers read).
func fillRedis(b *testing.B, raw *redis.Client, topic string, n int) {
	b.Helper()
	ctx := context.Background()
	var m redisstream.DefaultMarshallerUnmarshaller
	for start := 0; start < n; start += 1000 {
		pipe := raw.Pipeline()
		for i := start; i < min(n, start+1000); i++ {
			msg := message.NewMessage(strconv.Itoa(i), []byte(`{"type":"Point","coordinates":[4.9,52.37]}`))
			msg.Metadata.Set(MetaEntity, "vehicle-"+strconv.Itoa(i%1000))
			msg.Metadata.Set("vertex_count", "1")
			values, err := m.Marshal(topic, msg)
			if err != nil {
				b.Fatal(err)
			}
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: values})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func benchRedisConsume(b *testing.B, consumer string, consumers int, addr, topic string) {
	b.StopTimer()
	ct := newConsumeTimer(b.N)
	handler := func(*message.Message) error {
		ct.seen()
		return nil
	}
	var (
		run   func(context.Context) error
		close func() error
	)
	group := "bench-" + topic
	switch consumer {
	case "spillway", "spillway-no-otel":
		cfg := router.Config{Broker: "redis"}
		cfg.Telemetry.Disabled = consumer == "spillway-no-otel"
		cfg.Budget.Vertices = 1 << 40
		cfg.Redis.Addr = addr
		cfg.Redis.ConsumerGroup = group
		cfg.Redis.Consumer = group
		cfg.Redis.Consumers = consumers
		r, err := router.New(cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.AddConsumerHandler("h", topic, handler); err != nil {
			b.Fatal(err)
		}
		run, close = r.Run, r.Close
	default:
		wm, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		for i := range consumers {
			sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client:                        redis.NewClient(&redis.Options{Addr: addr}),
				Consumer:                      group + "-" + strconv.Itoa(i),
				ConsumerGroup:                 group,
				BlockTime:                     redisBlockTime,
				OldestId:                      "0",
				DisableIndefiniteInitialBlock: true,
			}, watermill.NopLogger{})
			if err != nil {
				b.Fatal(err)
			}
			wm.AddConsumerHandler("h"+strconv.Itoa(i), topic, sub, handler)
		}
		run, close = wm.Run, wm.Close
	}
	ct.measure(b, run, close)
}
