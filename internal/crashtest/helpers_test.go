package crashtest_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/router"
)

// retrySection gives the retry gate (on by default) short intervals: a
// failing message is tried three times, then dead-lettered to
// "<topic>.dead_letter".
const retrySection = `retry:
  max_attempts: 3
  initial_interval: 20ms
  max_interval: 50ms
  max_elapsed_time: 1s
`

// stampingPublisher is the publisher of a router built from cfg: it stamps
// vertex_count. It lives until the test ends.
func stampingPublisher(t *testing.T, cfg string) message.Publisher {
	t.Helper()
	r, err := router.New(loadConfig(t, cfg), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r.Publisher()
}

func loadConfig(t *testing.T, yaml string) router.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "spillway.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := router.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// rawPublisher publishes without stamping, as a producer outside Spillway
// (or a hostile one) would.
func rawPublisher(t *testing.T, c router.Config) message.Publisher {
	t.Helper()
	switch c.Broker {
	case "kafka":
		cl, err := kafkabroker.New(c.Kafka)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		p, err := cl.NewPublisher()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	default:
		p, err := redisbroker.NewPublisher(c.Redis)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
}

// collect consumes topic in the test process (its own consumer group) and
// records the ids it sees.
type collected struct {
	mu  sync.Mutex
	ids map[string]int
}

func (c *collected) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.ids))
	for id, n := range c.ids {
		out[id] = n
	}
	return out
}

func (c *collected) has(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[id] > 0
}

func collect(t *testing.T, yaml, group, topic string) *collected {
	t.Helper()
	c := loadConfig(t, yaml)
	c.Kafka.ConsumerGroup = group
	c.Redis.ConsumerGroup = group
	c.Budget.MaxPayloadBytes = -1 // it reads what the consumers refused as too large
	r, err := router.New(c, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	got := &collected{ids: map[string]int{}}
	if _, err := r.AddConsumerHandler("collect", topic, func(msg *message.Message) error {
		got.mu.Lock()
		got.ids[msg.UUID]++
		got.mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() {
		_ = r.Close()
		<-done
	})
	return got
}
