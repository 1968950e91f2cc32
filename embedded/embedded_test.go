package embedded_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/embedreg"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/router"
)

func TestRegistered(t *testing.T) {
	// Brokers [embedded] is valid only once a broker is registered.
	kafkaErr := kafkabroker.Config{Brokers: []string{spillway.Embedded}}.WithDefaults().Validate()
	if kafkaErr != nil || embedreg.Redis() == nil {
		t.Fatalf("importing embedded registers nothing: kafka %v, redis %v", kafkaErr, embedreg.Redis() != nil)
	}
}

// The router on each embedded broker, chosen by configuration alone:
// published messages come back through a handler, and Close stops the
// broker the router started.
func TestRouterOnEmbeddedBrokers(t *testing.T) {
	for _, broker := range []string{"kafka", "redis"} {
		t.Run(string(broker), func(t *testing.T) {
			cfg := router.Config{Broker: broker, CloseTimeout: 10 * time.Second}
			cfg.Budget.Vertices = 1000
			cfg.Kafka.Brokers = []string{spillway.Embedded}
			cfg.Kafka.Partitions = 2
			cfg.Redis.Addr = spillway.Embedded
			cfg.Telemetry.Disabled = true
			r, err := router.New(cfg, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			const n = 5
			var (
				mu   sync.Mutex
				seen = map[string]bool{}
				done = make(chan struct{})
			)
			if _, err := r.AddConsumerHandler("h", "shapes", func(msg *message.Message) error {
				mu.Lock()
				defer mu.Unlock()
				seen[string(msg.Payload)] = true
				if len(seen) == n {
					close(done)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			runErr := make(chan error, 1)
			go func() { runErr <- r.Run(ctx) }()
			<-r.Running()
			for i := range n {
				payload := `{"type":"Point","coordinates":[` + strconv.Itoa(i) + `,0]}`
				if err := r.Publisher().Publish("shapes", message.NewMessage(watermill.NewUUID(), []byte(payload))); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Fatalf("%d of %d messages arrived", len(seen), n)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-runErr; err != nil {
				t.Fatal(err)
			}
		})
	}
}
