package router

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// TestRevocationStepAsideAndLateCommit pins the mechanism down without any
// timing pressure: one message holds the whole budget, another waits; a
// second member joins. The waiter steps aside at once when the session
// ends (not run, not committed), the admitted message finishes after the
// session ended and is committed anyway, and after the rebalance each
// message has run exactly once.
func TestRevocationStepAsideAndLateCommit(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cluster := kafkatest.Start(t, 2, "r")

	cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = 100
	cfg.Kafka.Brokers = cluster.Brokers()
	cfg.Kafka.Version = "2.3.0" // kfake's limit
	cfg.Kafka.Partitions = 2
	cfg.Kafka.RebalanceTimeout = 20 * time.Second
	cfg.Kafka.HeartbeatInterval = 100 * time.Millisecond

	var (
		mu      sync.Mutex
		runs    = map[string]int{}
		started = make(chan string, 8)
		unblock = make(chan struct{})
		first   sync.Once
	)
	handler := func(msg *message.Message) error {
		started <- msg.UUID
		blocked := false
		first.Do(func() { blocked = true })
		if blocked {
			<-unblock
		}
		mu.Lock()
		runs[msg.UUID]++
		mu.Unlock()
		return nil
	}
	aSessions := newSessionLog("r")
	a := groupMember(t, cfg, "r", handler, WithKafka(kafkabroker.WithTracer(aSessions)))
	for i, uuid := range []string{"x", "y"} {
		msg := message.NewMessage(uuid, pingPayload(i))
		msg.Metadata.Set("entity_id", keyFor(t, "r", int32(i), 2))
		msg.Metadata.Set(cost.MetadataKey, "100")
		if err := a.Publisher().Publish("r", msg); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, 2)
	go func() { errs <- a.Run(context.Background()) }()

	admitted := <-started
	waiting := map[string]string{"x": "y", "y": "x"}[admitted]
	waitFor(t, "a waiter", func() bool { return a.budget.Stats().Waiting == 1 })

	b := groupMember(t, cfg, "r", handler)
	go func() { errs <- b.Run(context.Background()) }()

	waitFor(t, "the first session to end", func() bool {
		ev := aSessions.sessions()
		return len(ev) > 0 && !ev[0].ended.IsZero()
	})
	waitFor(t, "the waiter to step aside", func() bool { return a.Stats().Revocations == 1 })
	mu.Lock()
	if runs[waiting] != 0 {
		t.Fatalf("waiting message %s ran", waiting)
	}
	mu.Unlock()

	close(unblock) // the admitted handler finishes after its session ended
	waitFor(t, "the waiting message to be processed after the rebalance", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return runs[waiting] == 1 && runs[admitted] == 1
	})
	time.Sleep(time.Second) // room for a duplicate to show up

	st := a.Stats()
	if st.LateMarks != 1 {
		t.Errorf("late marks = %d, want 1 (the admitted message committed after its session ended)", st.LateMarks)
	}
	if st.Evictions+b.Stats().Evictions != 0 {
		t.Errorf("evictions: %d", st.Evictions+b.Stats().Evictions)
	}
	closeMembers(t, errs, b, a)
	mu.Lock()
	defer mu.Unlock()
	if runs[admitted] != 1 || runs[waiting] != 1 {
		t.Errorf("runs = %v, want each message once", runs)
	}
}

// groupMember is a Kafka router of cfg's consumer group with one handler,
// "geo", on topic.
func groupMember(t *testing.T, cfg Config, topic string, h message.NoPublishHandlerFunc, opts ...Option) *Router {
	t.Helper()
	r, err := New(cfg, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddConsumerHandler("geo", topic, h); err != nil {
		t.Fatal(err)
	}
	return r
}

// closeMembers closes the routers in order and checks what each Run,
// reporting on errs, returned.
func closeMembers(t *testing.T, errs <-chan error, members ...*Router) {
	t.Helper()
	for _, r := range members {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}
	for range members {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// countingTracer is an inner tracer that counts the hooks it gets and
// wraps the consumer group handler, as the OTel tracer does.
type countingTracer struct {
	kafka.SaramaTracer
	mu       sync.Mutex
	handlers int
	claims   int
}

type countingHandler struct {
	sarama.ConsumerGroupHandler
	t *countingTracer
}

func (h countingHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	h.t.mu.Lock()
	h.t.claims++
	h.t.mu.Unlock()
	return h.ConsumerGroupHandler.ConsumeClaim(s, c)
}

func (t *countingTracer) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	t.mu.Lock()
	t.handlers++
	t.mu.Unlock()
	return countingHandler{ConsumerGroupHandler: t.SaramaTracer.WrapConsumerGroupHandler(h), t: t}
}

// TestTracerComposes: a tracer given with WithKafka(kafkabroker.WithTracer(…)) (here the OTel
// one, counted) wraps the router's session tracker instead of replacing it.
func TestTracerComposes(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	inner := &countingTracer{SaramaTracer: kafka.NewOTELSaramaTracer()}
	cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
	cfg.Kafka.Brokers = []string{spillway.Embedded}
	cfg.Kafka.Partitions = 2
	r, err := New(cfg, nil, WithKafka(kafkabroker.WithTracer(inner)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// known reports whether the session tracker knew the delivery's
	// session while its handler ran.
	known := make(chan bool, 1)
	if _, err := r.AddConsumerHandler("h", "traced", func(m *message.Message) error {
		known <- r.kafkaTracker("h") != nil && r.kafkaTracker("h").Revoked(m) != nil
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	if err := r.Publisher().Publish("traced", message.NewMessage("m", pingPayload(3))); err != nil {
		t.Fatal(err)
	}
	select {
	case ok := <-known:
		if !ok {
			t.Error("session tracker bypassed: it does not know the delivery's session")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("message not delivered through the composed tracers")
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	inner.mu.Lock()
	defer inner.mu.Unlock()
	if inner.handlers == 0 || inner.claims == 0 {
		t.Errorf("inner tracer not used: %d handlers, %d claims", inner.handlers, inner.claims)
	}
}

// TestRevocationEndsRetryBackoff: a message backing off in the retry gate
// when its session ends steps aside at once, as a budget waiter does: the
// rebalance does not wait for the backoff, the next session runs the
// message again, and it succeeds exactly once.
func TestRevocationEndsRetryBackoff(t *testing.T) {
	for _, mode := range []string{kafkabroker.ConsumerPartition, kafkabroker.ConsumerKey} {
		t.Run(mode, func(t *testing.T) { testRevocationEndsRetryBackoff(t, mode) })
	}
}

func testRevocationEndsRetryBackoff(t *testing.T, mode string) {
	defer goleak.VerifyNone(t, leakOptions...)
	cluster := kafkatest.Start(t, 2, "rb")

	cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = 100
	cfg.Kafka.Brokers = cluster.Brokers()
	cfg.Kafka.Version = "2.3.0" // kfake's limit
	cfg.Kafka.Partitions = 2
	cfg.Kafka.Consumer = mode
	cfg.Kafka.RebalanceTimeout = 60 * time.Second
	cfg.Kafka.HeartbeatInterval = 100 * time.Millisecond
	cfg.Retry.InitialInterval = 15 * time.Second // a backoff far longer than a rebalance
	cfg.Retry.MaxInterval = 15 * time.Second
	cfg.Retry.MaxElapsedTime = 25 * time.Second
	cfg.Retry.Jitter = spillway.Off

	var (
		mu       sync.Mutex
		attempts int
		handled  int
		failed   = make(chan struct{})
		once     sync.Once
	)
	handler := func(*message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if attempts == 1 {
			once.Do(func() { close(failed) })
			return errors.New("transient")
		}
		handled++
		return nil
	}
	newMember := func() *Router { return groupMember(t, cfg, "rb", handler) }
	a := newMember()
	msg := message.NewMessage("x", pingPayload(0))
	msg.Metadata.Set(cost.MetadataKey, "1")
	if err := a.Publisher().Publish("rb", msg); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { errs <- a.Run(context.Background()) }()
	<-failed // the first attempt failed: the message now backs off for 15 s

	b := newMember()
	joined := time.Now()
	go func() { errs <- b.Run(context.Background()) }()
	waitFor(t, "the message to be handled after the rebalance", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled == 1
	})
	if d := time.Since(joined); d > 10*time.Second {
		t.Errorf("handled %v after the second member joined: the rebalance waited for the 15 s backoff", d.Round(time.Millisecond))
	}
	time.Sleep(time.Second) // room for a duplicate to show up
	if st := a.Stats(); st.Revocations != 1 || st.Retry == nil || st.Evictions+b.Stats().Evictions != 0 {
		t.Errorf("revocations = %d (want 1: the backing-off message stepped aside), evictions %d", st.Revocations, st.Evictions+b.Stats().Evictions)
	}
	closeMembers(t, errs, b, a)
	mu.Lock()
	defer mu.Unlock()
	if handled != 1 || attempts != 2 {
		t.Errorf("attempts = %d, handled = %d; want 2 and 1", attempts, handled)
	}
}
