package router

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/retrygate"
)

// retryOutcomes records the retry gate's outcomes.
type retryOutcomes struct {
	mu  sync.Mutex
	evs []retrygate.Event
}

func (o *retryOutcomes) OnRetryOutcome(e retrygate.Event) {
	o.mu.Lock()
	e.Message = nil
	o.evs = append(o.evs, e)
	o.mu.Unlock()
}

func (o *retryOutcomes) find(outcome retrygate.Outcome, cause string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range o.evs {
		if e.Outcome == outcome && e.Cause == cause {
			return true
		}
	}
	return false
}

// idleMember is a consumer-group member that claims partitions and
// processes nothing.
type idleMember struct{}

func (idleMember) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (idleMember) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (idleMember) ConsumeClaim(s sarama.ConsumerGroupSession, _ sarama.ConsumerGroupClaim) error {
	<-s.Context().Done()
	return nil
}

// TestEdgeKafkaBrokerRedeliveryShedBeforeFresh: a Kafka message that
// waited for budget, stepped aside when its session ended (a second member
// joined) and was redelivered by the broker is redelivered work: while the
// consumer is still saturated, the retry gate defers it on arrival
// ("saturated_on_arrival") instead of making it wait for budget again as if
// it were fresh.
func TestEdgeKafkaBrokerRedeliveryShedBeforeFresh(t *testing.T) {
	cluster := kafkatest.Start(t, 1, "rd")
	cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = 100
	cfg.Kafka.Brokers = cluster.Brokers()
	cfg.Kafka.Version = "2.3.0" // kfake's limit
	cfg.Kafka.Partitions = 1
	cfg.Kafka.CreateTopics = true
	cfg.Kafka.RebalanceTimeout = 20 * time.Second
	cfg.Kafka.HeartbeatInterval = 100 * time.Millisecond
	cfg.Retry.MaxElapsedTime = 5 * time.Second
	outcomes := &retryOutcomes{}
	r, err := New(cfg, nil, WithHooks(outcomes))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 4)
	if _, err := r.AddConsumerHandler("geo", "rd", func(m *message.Message) error {
		ran <- m.UUID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Saturate the budget for the whole test: the message waits.
	hold, err := r.budget.Acquire(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage("x", pingPayload(0))
	msg.Metadata.Set(cost.MetadataKey, "10")
	if err := r.Publisher().Publish("rd", msg); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 1)
	go func() { errs <- r.Run(context.Background()) }()
	waitFor(t, "the message to wait for budget", func() bool { return r.budget.Stats().Waiting == 1 })
	if outcomes.find(retrygate.Deferred, "saturated_on_arrival") {
		t.Fatal("a fresh message was deferred on arrival")
	}

	// A second member joins: the session ends, the waiter steps aside
	// uncommitted, and the broker hands the message out again.
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_3_0_0
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Group.Heartbeat.Interval = 100 * time.Millisecond
	sc.Consumer.Group.Rebalance.Timeout = 20 * time.Second
	group, err := sarama.NewConsumerGroup(cluster.Brokers(), r.back.group("geo"), sc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	joined := make(chan struct{})
	go func() {
		defer close(joined)
		_ = group.Consume(ctx, []string{"rd"}, idleMember{})
	}()
	waitFor(t, "the waiter to step aside", func() bool { return r.Stats().Revocations >= 1 })
	// Leave again, so that this router owns the partition whatever the
	// assignment was.
	cancel()
	<-joined
	_ = group.Close()

	waitFor(t, "the redelivery to be deferred on arrival", func() bool {
		return outcomes.find(retrygate.Deferred, "saturated_on_arrival")
	})
	select {
	case u := <-ran:
		t.Errorf("handler ran %s while the budget was saturated", u)
	default:
	}
	hold.Release()
	// The deferred copy comes back through the retry topic and runs.
	select {
	case u := <-ran:
		if u != "x" {
			t.Errorf("ran %s", u)
		}
	case <-time.After(30 * time.Second):
		t.Error("the deferred message never ran")
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	if err := <-errs; err != nil {
		t.Error(err)
	}
}

// kafka.brokers pointing at a Redis port: Redis never replies to Kafka's
// request, and Sarama's read timeout (the rebalance timeout plus 5 s, four
// attempts) held New for over four minutes. New now fails within seconds,
// naming the address and asking whether it is a Kafka listener, with the
// read error still wrapped.
func TestNewOnARedisPortAsksIfItIsKafka(t *testing.T) {
	srv := redistest.Start(t)
	cfg := Config{Broker: brokerKafka}
	cfg.Kafka.Brokers = []string{srv.Addr()}
	cfg.Telemetry.Disabled = true
	start := time.Now()
	r, err := New(cfg, nil)
	if err == nil {
		_ = r.Close()
		t.Fatal("New succeeded on a Redis port")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("New took %v", took)
	}
	var ne net.Error
	if !errors.Is(err, kafkabroker.ErrNotKafkaListener) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("New = %v, want ErrNotKafkaListener wrapping the read timeout", err)
	}
	if want := "is " + srv.Addr() + " a Kafka listener?"; !strings.Contains(err.Error(), want) {
		t.Errorf("%q lacks %q", err, want)
	}
}
