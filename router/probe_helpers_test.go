package router

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/stackprobe"
)

// runProbed builds a router from cfg with a stackprobe.Probe outside its
// whole stack, runs n stamped pings through a handler that does nothing
// and returns the probe once all n are handled. check, if not nil, sees the
// router before it runs. On Kafka the pings are published first, as a
// backlog the new group reads from the oldest offset.
func runProbed(tb testing.TB, cfg Config, n int, check func(*Router)) *stackprobe.Probe {
	tb.Helper()
	probe := new(stackprobe.Probe)
	runWithOuter(tb, cfg, n, probe.Middleware, check)
	return probe
}

// probeKafka points cfg at the embedded Kafka broker at brokers, on topics
// of partitions partitions that the router creates, with a consumer group
// of its own.
func probeKafka(cfg *Config, brokers []string, partitions int32) {
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.Version = "2.3.0" // kfake's limit
	cfg.Kafka.Partitions = partitions
	cfg.Kafka.CreateTopics = true
	cfg.Kafka.ConsumerGroup = "probe-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// runWithOuter is runProbed with any middleware outside the whole stack.
func runWithOuter(tb testing.TB, cfg Config, n int, outer message.HandlerMiddleware, check func(*Router)) {
	tb.Helper()
	r, err := newRouter(cfg, nil, options{}, control{outer: outer})
	if err != nil {
		tb.Fatal(err)
	}
	defer r.Close()
	if check != nil {
		check(r)
	}
	topic := "probe-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var seen atomic.Int64
	done := make(chan struct{})
	if _, err := r.AddConsumerHandler("probe", topic, func(*message.Message) error {
		if seen.Add(1) == int64(n) {
			close(done)
		}
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	publish := func() {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = message.NewMessage(strconv.Itoa(i), pingPayload(i))
			msgs[i].Metadata.Set("vertex_count", "1")
		}
		if err := r.Publisher().Publish(topic, msgs...); err != nil {
			tb.Fatal(err)
		}
	}
	if cfg.Broker == BrokerKafka {
		publish()
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	if cfg.Broker != BrokerKafka {
		publish()
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		tb.Fatalf("%d of %d messages handled", seen.Load(), n)
	}
}
