package router

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// plainConsumer is a Sarama consumer group handler of another client,
// which knows nothing of Spillway's commit metadata: it records every
// value it receives until it has seen the record last.
type plainConsumer struct {
	last string
	mu   sync.Mutex
	got  []string
	done chan struct{}
	once sync.Once
}

func (h *plainConsumer) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *plainConsumer) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *plainConsumer) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case <-sess.Context().Done():
			return nil
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			h.mu.Lock()
			h.got = append(h.got, string(m.Value))
			h.mu.Unlock()
			sess.MarkMessage(m, "")
			if string(m.Value) == h.last {
				h.once.Do(func() { close(h.done) })
			}
		}
	}
}

// TestKafkaKeyHandoverRedo: in key mode, records finished past the
// committed watermark are known only to Spillway's commit metadata. A
// plain Sarama consumer taking over the group starts at the watermark and
// redoes them: some, but never more than the span of the partition
// (8 × kafka.window_messages), since no record past the span is read
// before the watermark moves.
func TestKafkaKeyHandoverRedo(t *testing.T) {
	const (
		topic  = "handover"
		window = 4
		span   = 8 * window
		n      = 100
	)
	broker := kafkatest.Start(t, 1, topic)
	cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = 1000
	cfg.Retry.Disabled = true
	cfg.Kafka.Brokers = broker.Brokers()
	cfg.Kafka.Version = "2.3.0"
	cfg.Kafka.Partitions = 1
	cfg.Kafka.HeartbeatInterval = 250 * time.Millisecond
	cfg.Kafka.Consumer = kafkabroker.ConsumerKey
	cfg.Kafka.WindowMessages = window
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Record 0 (key "slow") never succeeds while Spillway owns the group;
	// every other record, each of its own key, finishes at once.
	for i := range n {
		msg := message.NewMessage("m"+strconv.Itoa(i), pingPayload(i))
		msg.Metadata.Set("entity_id", "k"+strconv.Itoa(i))
		if i == 0 {
			msg.Metadata.Set("entity_id", "slow")
		}
		if err := r.Publisher().Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu       sync.Mutex
		finished = map[string]bool{}
		stop     = make(chan struct{})
	)
	if _, err := r.AddConsumerHandler("h", topic, func(msg *message.Message) error {
		if msg.Metadata.Get("entity_id") == "slow" {
			select {
			case <-msg.Context().Done():
			case <-stop:
			}
			return errors.New("stopped") // nacked: record 0 stays unfinished
		}
		mu.Lock()
		finished[string(msg.Payload)] = true
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.Background()) }()
	// Wait until the span is full: nothing more is read until record 0
	// finishes.
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		k := len(finished)
		mu.Unlock()
		if k >= span-1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // the watermark's commit lands
	close(stop)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	<-runErr
	mu.Lock()
	doneBySpillway := len(finished)
	mu.Unlock()
	if doneBySpillway == 0 || doneBySpillway > span {
		t.Fatalf("Spillway finished %d records before the handover, want 1 to %d", doneBySpillway, span)
	}

	// Another client takes the group over.
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_3_0_0
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Group.Heartbeat.Interval = 250 * time.Millisecond
	group, err := sarama.NewConsumerGroup(broker.Brokers(), cfg.Kafka.WithDefaults().ConsumerGroup+".h", sc)
	if err != nil {
		t.Fatal(err)
	}
	h := &plainConsumer{last: string(pingPayload(n - 1)), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for ctx.Err() == nil {
			if err := group.Consume(ctx, []string{topic}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	select {
	case <-h.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the other client did not reach the end of the partition")
	}
	cancel()
	<-consumed
	if err := group.Close(); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	redo := 0
	for _, v := range h.got {
		if finished[v] {
			redo++
		}
	}
	t.Logf("Spillway finished %d records; the other client received %d and redid %d (span %d)", doneBySpillway, len(h.got), redo, span)
	if redo == 0 {
		t.Errorf("the other client redid nothing: the test did not leave finished records past the watermark")
	}
	if redo > span {
		t.Errorf("the other client redid %d records, more than the span (%d)", redo, span)
	}
	if len(h.got) != n-doneBySpillway+redo {
		t.Errorf("the other client received %d records, want %d (every record Spillway did not finish, and the redone ones)", len(h.got), n-doneBySpillway+redo)
	}
}

// TestKafkaKeyHandoverDrained: drained first (Router.Lag at 0), a key-mode
// group hands over to a plain Sarama consumer with nothing redone: it
// receives only what was produced after.
func TestKafkaKeyHandoverDrained(t *testing.T) {
	const (
		topic = "handover-drained"
		n     = 50
	)
	broker := kafkatest.Start(t, 2, topic)
	cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = 1000
	cfg.Retry.Disabled = true
	cfg.Kafka.Brokers = broker.Brokers()
	cfg.Kafka.Version = "2.3.0"
	cfg.Kafka.Partitions = 2
	cfg.Kafka.HeartbeatInterval = 250 * time.Millisecond
	cfg.Kafka.Consumer = kafkabroker.ConsumerKey
	cfg.Kafka.WindowMessages = 4
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		msg := message.NewMessage("m"+strconv.Itoa(i), pingPayload(i))
		msg.Metadata.Set("entity_id", "k"+strconv.Itoa(i%7))
		if err := r.Publisher().Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.AddConsumerHandler("h", topic, func(*message.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		if lag, err := r.Lag(ctx); err == nil && lag == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the group did not drain")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	<-runErr

	sc := sarama.NewConfig()
	sc.Version = sarama.V2_3_0_0
	sc.Producer.Return.Successes = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Group.Heartbeat.Interval = 250 * time.Millisecond
	after := "after the handover"
	producer, err := sarama.NewSyncProducer(broker.Brokers(), sc)
	if err != nil {
		t.Fatal(err)
	}
	for p := range int32(2) {
		if _, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: p, Value: sarama.StringEncoder(after)}); err != nil {
			t.Fatal(err)
		}
	}
	producer.Close()
	group, err := sarama.NewConsumerGroup(broker.Brokers(), cfg.Kafka.WithDefaults().ConsumerGroup+".h", sc)
	if err != nil {
		t.Fatal(err)
	}
	h := &plainConsumer{last: after, done: make(chan struct{})}
	cctx, ccancel := context.WithCancel(context.Background())
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for cctx.Err() == nil {
			if err := group.Consume(cctx, []string{topic}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		h.mu.Lock()
		k := 0
		for _, v := range h.got {
			if v == after {
				k++
			}
		}
		h.mu.Unlock()
		if k == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other client did not receive the records produced after the handover")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	ccancel()
	<-consumed
	if err := group.Close(); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.got) != 2 {
		t.Errorf("the other client received %d records, want only the 2 produced after the handover: %q", len(h.got), h.got)
	}
}
