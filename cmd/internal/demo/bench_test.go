package demo

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/geodata"
	"github.com/spillway-go/spillway/router"
)

// BenchmarkKafkaConsume measures end-to-end consumption on the embedded
// Kafka broker (kfake): b.N small stamped messages on 12 partitions,
// published before the consumer starts, timed from the first message
// handled to the last. The handler does nothing, so the consumer's own
// cost is all there is to measure. Compare the ratios within one run:
//
//	go test -run '^$' -bench KafkaConsume -benchmem -count 6 ./internal/demo/
//
//	consumer=upstream-defaults  Watermill router + watermill-kafka subscriber,
//	                            Sarama defaults (DefaultSaramaSubscriberConfig)
//	consumer=upstream           the same with the Sarama settings the Spillway
//	                            router uses (16-message window, 256 KiB fetch)
//	consumer=spillway           the Spillway router: the same subscriber plus
//	                            the session tracker and the middleware stack
//	                            (retry gate, shutdown gate, budget admission,
//	                            accounting), telemetry on as by default (no
//	                            providers: the OpenTelemetry no-op globals,
//	                            the lag sampler)
//	consumer=spillway-no-otel   the same with telemetry.disabled
//	consumer=spillway-no-retry  the same with retry.disabled
//	consumer=spillway-key       the Spillway router with kafka.consumer key
//	                            (Spillway's key subscriber instead of
//	                            watermill-kafka's subscriber)
//
// benchCluster starts an embedded Kafka cluster with partitions per topic
// and a stamping publisher to it; both close when b ends.
func benchCluster(b *testing.B, partitions int) (*cluster, message.Publisher) {
	b.Helper()
	cl, err := startCluster(partitions)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.close)
	prod, err := newBatchPublisher(cl.brokers, 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = prod.Close() })
	return cl, cost.NewStampingPublisher(prod)
}

func BenchmarkKafkaConsume(b *testing.B) {
	var seq atomic.Int64
	for _, c := range []string{"upstream-defaults", "upstream", "spillway", "spillway-no-otel", "spillway-no-retry", "spillway-key"} {
		b.Run("consumer="+c, func(b *testing.B) {
			// A broker of its own: the consumers after the first would
			// otherwise run next to every earlier one's messages.
			cl, pub := benchCluster(b, 12)
			topic := fmt.Sprintf("bench-%s-%d", c, seq.Add(1))
			publishBench(b, pub, topic, b.N, []byte(`{"type":"Point","coordinates":[4.9,52.37]}`))
			benchConsume(b, c, cl.brokers, topic, nil)
		})
	}
}

// BenchmarkKafkaConsumePolygon is BenchmarkKafkaConsume with a handler
// that does what the README's does: each message is a country of about
// 500 vertices (testdata), which the handler decodes and measures.
//
//	go test -run '^$' -bench KafkaConsumePolygon -benchtime 20000x -count 6 ./internal/demo/
func BenchmarkKafkaConsumePolygon(b *testing.B) {
	fs, err := geodata.Load(geodata.Countries)
	if err != nil {
		b.Fatal(err)
	}
	poly := fs[0]
	for _, f := range fs {
		if abs(f.Vertices-500) < abs(poly.Vertices-500) {
			poly = f
		}
	}
	var (
		seq      atomic.Int64
		vertices atomic.Int64
	)
	decode := func(msg *message.Message) error {
		g, err := cost.Decode(msg.Payload)
		if err != nil {
			return err
		}
		vertices.Add(int64(len(g.FlatCoords()) / g.Stride()))
		return nil
	}
	for _, c := range []string{"upstream", "spillway", "spillway-no-retry"} {
		b.Run("consumer="+c, func(b *testing.B) {
			cl, pub := benchCluster(b, 12)
			topic := fmt.Sprintf("bench-polygon-%s-%d", c, seq.Add(1))
			publishBench(b, pub, topic, b.N, poly.Geometry)
			vertices.Store(0)
			benchConsume(b, c, cl.brokers, topic, decode)
			if got, want := vertices.Load(), int64(b.N*poly.Vertices); got < want {
				b.Fatalf("handlers counted %d vertices, want at least %d", got, want)
			}
		})
	}
}

func abs(n int) int { return max(n, -n) }

// publishBench publishes n messages with payload to topic, each keyed by
// one of 1,000 entities.
func publishBench(b *testing.B, pub message.Publisher, topic string, n int, payload []byte) {
	b.Helper()
	const batch = 1000
	for i := 0; i < n; i += batch {
		var msgs []*message.Message
		for j := i; j < min(i+batch, n); j++ {
			m := message.NewMessage(strconv.Itoa(j), payload)
			m.Metadata.Set(MetaEntity, "vehicle-"+strconv.Itoa(j%1000))
			msgs = append(msgs, m)
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			b.Fatal(err)
		}
	}
}

// benchConsume consumes b.N messages of topic with consumer, running work
// (if not nil) in the handler of each.
func benchConsume(b *testing.B, consumer string, brokers []string, topic string, work func(*message.Message) error) {
	b.StopTimer()
	ct := newConsumeTimer(b.N)
	handler := func(msg *message.Message) error {
		if work != nil {
			if err := work(msg); err != nil {
				return err
			}
		}
		ct.seen()
		return nil
	}
	var (
		run   func(context.Context) error
		close func() error
	)
	group := "bench-" + topic
	switch consumer {
	case "spillway", "spillway-no-otel", "spillway-no-retry", "spillway-key":
		cfg := router.Config{Broker: "kafka"}
		if consumer == "spillway-key" {
			cfg.Kafka.Consumer = "key"
		}
		cfg.Telemetry.Disabled = consumer == "spillway-no-otel"
		cfg.Retry.Disabled = consumer == "spillway-no-retry"
		cfg.Budget.Vertices = 1 << 40
		cfg.Kafka.Brokers = brokers
		cfg.Kafka.Version = kafkaVersion.String() // kfake's limit
		cfg.Kafka.CreateTopics = true
		cfg.Kafka.ConsumerGroup = group
		cfg.Kafka.Partitions = 12
		r, err := router.New(cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.AddConsumerHandler("h", topic, handler); err != nil {
			b.Fatal(err)
		}
		run, close = r.Run, r.Close
	default:
		c := naiveSaramaConfig(10*time.Second, 3*time.Second)
		if consumer == "upstream" {
			// What the Spillway router sets (docs/kafka.md).
			c.ChannelBufferSize = 16
			c.Consumer.Fetch.Default = routerFetchBytes
			c.Consumer.Group.Heartbeat.Interval = time.Second
		}
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers: brokers, Unmarshaler: marshaler(), OverwriteSaramaConfig: c, ConsumerGroup: group,
		}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		wm, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		wm.AddConsumerHandler("h", topic, sub, handler)
		run, close = wm.Run, wm.Close
	}
	ct.measure(b, run, close)
}

// consumeTimer times a consume benchmark whose backlog of b.N messages is
// published before the consumer starts: first closes at the first message
// handled, done at the b.N-th.
type consumeTimer struct {
	handled     atomic.Int64
	target      int64
	first, done chan struct{}
	once        sync.Once
}

func newConsumeTimer(n int) *consumeTimer {
	return &consumeTimer{target: int64(n), first: make(chan struct{}), done: make(chan struct{})}
}

// seen counts one handled message; handlers call it.
func (t *consumeTimer) seen() {
	t.once.Do(func() { close(t.first) })
	if t.handled.Add(1) == t.target {
		close(t.done)
	}
}

// measure runs the consumer, waits untimed for its first message (group
// joins and subscriptions are behind it), times the rest and stops the
// consumer. It reports msgs/s and cpu-ns/msg and returns the timed span.
func (t *consumeTimer) measure(b *testing.B, run func(context.Context) error, stop func() error) time.Duration {
	b.Helper()
	errc := make(chan error, 1)
	go func() { errc <- run(context.Background()) }()
	select {
	case <-t.first:
	case err := <-errc:
		b.Fatalf("consumer stopped: %v", err)
	case <-time.After(60 * time.Second):
		b.Fatal("no message consumed within 60s")
	}
	b.ReportAllocs()
	cpu0 := processCPU()
	start := time.Now()
	b.StartTimer()
	select {
	case <-t.done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d messages consumed", t.handled.Load(), t.target)
	}
	b.StopTimer()
	elapsed, cpu := time.Since(start), processCPU()-cpu0
	b.ReportMetric(float64(t.target)/elapsed.Seconds(), "msgs/s")
	// CPU of the whole process (an in-process broker included) per
	// message: unlike msgs/s it does not depend much on what else the
	// machine runs.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(t.target), "cpu-ns/msg")
	_ = stop()
	<-errc
	return elapsed
}

// processCPU returns the user and system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
