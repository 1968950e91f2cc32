package router

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"
)

// TestWithSaramaConfig: the hook runs last on the publisher's, every
// subscriber's and the admin/lag client's Sarama configuration, and its
// error fails New.
func TestWithSaramaConfig(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := Config{Broker: BrokerKafka, CloseTimeout: 10 * time.Second}
	cfg.Kafka.Brokers = []string{Embedded}
	cfg.Kafka.Partitions = 1
	cfg.Kafka.HeartbeatInterval = 300 * time.Millisecond
	var (
		mu    sync.Mutex
		kinds = map[string]int{}
	)
	hook := func(c *sarama.Config) error {
		if c.ClientID != "spillway" || c.Version != sarama.V2_3_0_0 {
			t.Errorf("hook ran before the kafka section was applied: client id %q, version %v", c.ClientID, c.Version)
		}
		kind := "admin"
		switch {
		case c.Consumer.Group.Heartbeat.Interval == 300*time.Millisecond:
			kind = "subscriber"
		case c.Producer.Return.Successes:
			kind = "publisher"
		}
		mu.Lock()
		kinds[kind]++
		mu.Unlock()
		c.ClientID = "hooked"
		return nil
	}
	r, err := New(cfg, nil, WithSaramaConfig(hook))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.AddConsumerHandler("h", "hooked", func(*message.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.Lag(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for _, k := range []string{"admin", "publisher", "subscriber"} {
		if kinds[k] == 0 {
			t.Errorf("hook never called for the %s configuration (%v)", k, kinds)
		}
	}
	mu.Unlock()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	errNo := errors.New("refused by hook")
	_, err = New(cfg, nil, WithSaramaConfig(func(*sarama.Config) error { return errNo }))
	if !errors.Is(err, errNo) {
		t.Errorf("New with a failing hook = %v, want its error", err)
	}
}

// TestKafkaConfigErrorsNamed: kafkabroker's field errors come out of the
// router's Validate as ConfigErrors under kafka.
func TestKafkaConfigErrorsNamed(t *testing.T) {
	c := Config{Broker: BrokerKafka}
	c.Kafka.Brokers = []string{"ok:9092", "no-port"}
	c.Kafka.SASL.Mechanism = "GSSAPI"
	err := c.Validate()
	want := map[string]string{"kafka.brokers[1]": "no-port", "kafka.sasl.mechanism": "GSSAPI"}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ce *ConfigError
		if errors.As(e, &ce) && want[ce.Field] == ce.Value {
			delete(want, ce.Field)
		}
	}
	if len(want) > 0 {
		t.Errorf("missing %v in %v", want, err)
	}
}
