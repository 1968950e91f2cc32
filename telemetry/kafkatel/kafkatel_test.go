package kafkatel_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/telemetry/kafkatel"
)

func TestMain(m *testing.M) {
	// Sarama's metrics library starts one global ticker goroutine, and
	// Sarama finishes a metadata refresh that was in flight when its client
	// closed, then that goroutine ends by itself.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
		goleak.IgnoreAnyFunction("github.com/IBM/sarama.(*currentRefresh).start.func1"))
}

func saramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V2_3_0_0 // the newest the embedded broker's responses decode with
	c.Producer.Return.Successes = true
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Enable = false
	c.Consumer.Group.Heartbeat.Interval = 100 * time.Millisecond
	return c
}

// consumeUpTo is a consumer group handler that marks the first want[p]
// messages of each partition, commits, and reports when every partition is
// done.
type consumeUpTo struct {
	want map[int32]int64
	mu   sync.Mutex
	got  map[int32]int64
	done chan struct{}
	once sync.Once
}

func (h *consumeUpTo) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *consumeUpTo) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *consumeUpTo) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case <-sess.Context().Done():
			return nil
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			h.mu.Lock()
			if h.got[m.Partition] < h.want[m.Partition] {
				h.got[m.Partition]++
				sess.MarkMessage(m, "")
				sess.Commit()
			}
			finished := true
			for p, w := range h.want {
				if h.got[p] < w {
					finished = false
				}
			}
			h.mu.Unlock()
			if finished {
				h.once.Do(func() { close(h.done) })
			}
		}
	}
}

// Publish N per partition, consume M with a committing consumer group: the
// lag reads N−M per partition, through the source, the sampler and the
// spillway.consumer.lag metric.
func TestKafkaLagOverEmbeddedCluster(t *testing.T) {
	cluster := kafkatest.Start(t, 3, "parcels")
	addrs := cluster.Brokers()

	client, err := sarama.NewClient(addrs, saramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	published := map[int32]int64{0: 5, 1: 3, 2: 0}
	consumed := map[int32]int64{0: 2, 1: 3, 2: 0}
	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	for p, n := range published {
		for i := range n {
			if _, _, err := producer.SendMessage(&sarama.ProducerMessage{
				Topic: "parcels", Partition: p, Value: sarama.StringEncoder("m" + strconv.Itoa(int(i))),
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := producer.Close(); err != nil {
		t.Fatal(err)
	}

	group, err := sarama.NewConsumerGroup(addrs, "workers", saramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	h := &consumeUpTo{want: consumed, got: map[int32]int64{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	consumeDone := make(chan struct{})
	go func() {
		defer close(consumeDone)
		for ctx.Err() == nil {
			if err := group.Consume(ctx, []string{"parcels"}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
				t.Logf("consume: %v", err)
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	select {
	case <-h.done:
	case <-time.After(30 * time.Second):
		t.Fatal("consumer group did not consume in time")
	}
	cancel()
	<-consumeDone
	if err := group.Close(); err != nil {
		t.Fatal(err)
	}

	src, err := kafkatel.NewLagSource(client, "workers", "parcels")
	if err != nil {
		t.Fatal(err)
	}
	samples, err := src(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 3 {
		t.Fatalf("%d samples, want 3 partitions: %+v", len(samples), samples)
	}
	for _, s := range samples {
		if want := published[s.Partition] - consumed[s.Partition]; s.Lag != want || s.Group != "workers" || s.Topic != "parcels" {
			t.Errorf("partition %d: %+v, want lag %d", s.Partition, s, want)
		}
	}

	// A group that never committed lags by everything retained.
	idle, err := kafkatel.NewLagSource(client, "idle", "parcels")
	if err != nil {
		t.Fatal(err)
	}
	idleSamples, err := idle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range idleSamples {
		if s.Lag != published[s.Partition] {
			t.Errorf("idle group partition %d lag %d, want %d", s.Partition, s.Lag, published[s.Partition])
		}
	}

	// Through the sampler and the metric.
	reader := sdkmetric.NewManualReader()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	sampler := telemetry.NewLagSampler(src, telemetry.WithLagInterval(time.Hour))
	sampler.Start()
	defer sampler.Close()
	deadline := time.Now().Add(10 * time.Second)
	for sampler.TotalLag() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no sample")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := sampler.TotalLag(); got != 3 {
		t.Fatalf("TotalLag = %d, want 3", got)
	}
	if _, err := m.ObserveLag("kafka", sampler); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	gauge := lagGauge(t, rm)
	for p := range int32(3) {
		key := attribute.NewSet(attribute.String("topic", "parcels"), attribute.String("group", "workers"),
			attribute.Int("partition", int(p)))
		if got, want := gauge[key], published[p]-consumed[p]; got != want {
			t.Errorf("spillway.consumer.lag partition %d = %d, want %d", p, got, want)
		}
	}
}

func lagGauge(t *testing.T, rm metricdata.ResourceMetrics) map[attribute.Set]int64 {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "spillway.consumer.lag" {
				out := map[attribute.Set]int64{}
				for _, p := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					out[p.Attributes] = p.Value
				}
				return out
			}
		}
	}
	t.Fatal("no lag metric")
	return nil
}

// A message published through watermill-kafka with a TracingPublisher and
// consumed behind the Tracing middleware gets a consumer span whose parent
// is the producer span, with the partition, offset and key from the
// message context: through watermill-kafka's subscriber (partition mode)
// and through kafkabroker's key-mode subscriber, which keeps the record
// in the context under a key of its own.
func TestTracingOverEmbeddedKafka(t *testing.T) {
	for _, mode := range []string{kafkabroker.ConsumerPartition, kafkabroker.ConsumerKey} {
		t.Run(mode, func(t *testing.T) { testTracingOverEmbeddedKafka(t, mode) })
	}
}

func testTracingOverEmbeddedKafka(t *testing.T, mode string) {
	cluster := kafkatest.Start(t, 2, "parcels")
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	opts := []telemetry.Option{
		telemetry.WithTracerProvider(tp),
		telemetry.WithPropagator(propagation.TraceContext{}),
		telemetry.WithMessagingSystem("kafka"),
		telemetry.WithConsumerGroup("workers"),
		telemetry.WithAttributes(kafkatel.Attributes),
		telemetry.WithTopicFunc(func(*message.Message) string { return "parcels" }),
	}
	marshaler := kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.Metadata.Get("entity_id"), nil
	})
	kpub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: cluster.Brokers(), Marshaler: marshaler}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub := telemetry.NewTracingPublisher(kpub, opts...)
	defer pub.Close()

	ctx, root := tp.Tracer("test").Start(context.Background(), "request")
	msg := message.NewMessage("k-1", []byte("{}"))
	msg.Metadata.Set("entity_id", "veh-7")
	msg.SetContext(ctx)
	if err := pub.Publish("parcels", msg); err != nil {
		t.Fatal(err)
	}
	root.End()

	var sub message.Subscriber
	if mode == kafkabroker.ConsumerKey {
		kc, err := kafkabroker.New(kafkabroker.Config{
			Brokers: cluster.Brokers(), Version: "2.3.0", Consumer: kafkabroker.ConsumerKey,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer kc.Close()
		if sub, _, err = kc.NewSubscriber("workers"); err != nil {
			t.Fatal(err)
		}
	} else {
		subCfg := kafka.DefaultSaramaSubscriberConfig()
		subCfg.Consumer.Offsets.Initial = sarama.OffsetOldest
		if sub, err = kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers: cluster.Brokers(), Unmarshaler: marshaler, ConsumerGroup: "workers", OverwriteSaramaConfig: subCfg,
		}, nil); err != nil {
			t.Fatal(err)
		}
	}
	subCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(subCtx, "parcels")
	if err != nil {
		t.Fatal(err)
	}
	handle := telemetry.NewTracing(opts...)(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	select {
	case got := <-msgs:
		if _, err := handle(got); err != nil {
			t.Fatal(err)
		}
		got.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("nothing consumed")
	}
	cancel()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}

	var producer, consumer sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		switch s.Name() {
		case "send parcels":
			producer = s
		case "process parcels":
			consumer = s
		}
	}
	if producer == nil || consumer == nil {
		t.Fatalf("spans missing: %d ended", len(sr.Ended()))
	}
	if consumer.Parent().SpanID() != producer.SpanContext().SpanID() ||
		producer.Parent().SpanID() != root.SpanContext().SpanID() {
		t.Fatal("consumer span is not the child of the producer span across Kafka")
	}
	attrs := map[string]any{}
	for _, kv := range consumer.Attributes() {
		attrs[string(kv.Key)] = kv.Value.AsInterface()
	}
	for k, v := range map[string]any{
		"messaging.system":                   "kafka",
		"messaging.kafka.offset":             int64(0),
		"messaging.kafka.message.key":        "veh-7",
		"messaging.message.id":               "k-1",
		"messaging.consumer.group.name":      "workers",
		"messaging.destination.partition.id": nil, // present, value depends on the key's hash
	} {
		got, ok := attrs[k]
		if !ok || (v != nil && got != v) {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
}

func TestAttributes(t *testing.T) {
	if a := kafkatel.Attributes(message.NewMessage("x", nil)); a != nil {
		t.Fatalf("attributes for a non-Kafka message: %v", a)
	}
}

func TestNewLagSourceValidates(t *testing.T) {
	if _, err := kafkatel.NewLagSource(nil, "g", "t"); err == nil {
		t.Fatal("nil client accepted")
	}
}
