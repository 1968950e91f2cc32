package redisbroker_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// Spillway's publisher and subscriber against watermill-redisstream alone,
// in the same run on the same real server. Compare the ratios, not the
// absolute numbers (they depend on the machine). msg/s is wall-clock
// throughput and swings with other load on the machine; cpu-ns/op is the
// CPU time this process (client side, all goroutines; not redis-server)
// spent per message, which is steadier on a shared machine:
//
//	go test -run '^$' -bench . -benchmem -count 6 ./redisbroker/
//
// upstream/consumers=1 is upstream's only mode: one subscription per topic.
// spillway/consumers=1 isolates the wrappers' overhead (entry metadata,
// poison-safe unmarshaller, keep-alive tracking, fan-in, dead-letter check);
// spillway/consumers=4 is the default, several subscriptions per topic.

func benchPayload() []byte {
	p := make([]byte, 256)
	for i := range p {
		p[i] = byte('a' + i%26)
	}
	return p
}

func benchMessage(i int, payload []byte) *message.Message {
	m := message.NewMessage("bench-"+strconv.Itoa(i), payload)
	m.Metadata.Set("vertex_count", "42")
	return m
}

func BenchmarkPublish(b *testing.B) {
	srv := redistest.Start(b)
	payload := benchPayload()
	b.Run("upstream", func(b *testing.B) {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		benchPublish(b, pub, payload)
	})
	b.Run("spillway", func(b *testing.B) {
		pub, err := redisbroker.NewPublisher(redisbroker.Config{Addr: srv.Addr()})
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		benchPublish(b, pub, payload)
	})
}

func benchPublish(b *testing.B, pub message.Publisher, payload []byte) {
	topic := uniq("bench-pub")
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := range b.N {
		if err := pub.Publish(topic, benchMessage(i, payload)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
}

// cpuTime returns the user+system CPU time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkConsume(b *testing.B) {
	srv := redistest.Start(b)
	payload := benchPayload()
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()

	b.Run("upstream/consumers=1", func(b *testing.B) {
		topic := fill(b, raw, b.N, payload)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client:                        client,
			Consumer:                      uniq("c"),
			ConsumerGroup:                 uniq("g"),
			BlockTime:                     redisbroker.DefaultBlockTime,
			DisableIndefiniteInitialBlock: true,
		}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Close()
		benchConsume(b, sub, topic, func(h message.HandlerFunc) message.HandlerFunc { return h })
	})
	for _, consumers := range []int{1, 4} {
		b.Run("spillway/consumers="+strconv.Itoa(consumers), func(b *testing.B) {
			topic := fill(b, raw, b.N, payload)
			cfg := redisbroker.Config{Addr: srv.Addr(), ConsumerGroup: uniq("g"), Consumer: uniq("c"), Consumers: consumers}
			sub, err := redisbroker.NewSubscriber(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Close()
			pub, err := redisbroker.NewPublisher(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pub.Close()
			dl, err := redisbroker.NewDeadLetter(redisbroker.Config{}, redisbroker.WithPublisher(pub))
			if err != nil {
				b.Fatal(err)
			}
			benchConsume(b, sub, topic, dl.Middleware)
		})
	}
}

// fill appends n entries to a new stream, pipelined, off the clock.
func fill(b *testing.B, raw *redis.Client, n int, payload []byte) string {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	topic := uniq("bench-sub")
	ctx := context.Background()
	var m redisstream.DefaultMarshallerUnmarshaller
	for start := 0; start < n; start += 1000 {
		pipe := raw.Pipeline()
		for i := start; i < min(n, start+1000); i++ {
			values, err := m.Marshal(topic, benchMessage(i, payload))
			if err != nil {
				b.Fatal(err)
			}
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: values})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return topic
}

// benchConsume reads b.N messages through mw and acks each, as a router
// would with a handler that does nothing.
func benchConsume(b *testing.B, sub message.Subscriber, topic string, mw message.HandlerMiddleware) {
	b.Helper()
	h := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		b.Fatal(err)
	}
	timeout := time.After(5 * time.Minute)
	for range b.N {
		select {
		case msg := <-ch:
			if _, err := h(msg); err != nil {
				b.Fatal(err)
			}
			msg.Ack()
		case <-timeout:
			b.Fatal("timed out")
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
}
