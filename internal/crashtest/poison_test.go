package crashtest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/crashtest"
)

// Poison in a stream of good messages: payloads that cannot be decoded or
// counted, one over the payload cap, and forged vertex counts. The good messages flow; the poison
// ends in the dead-letter topic within the retry policy (three attempts),
// and nothing loops. A forged count only buys the budget's capacity: the
// message runs alone and is processed.
func TestEdgePoison(t *testing.T) {
	for _, b := range edgeBrokers {
		t.Run(b.name, func(t *testing.T) {
			// Payloads over 64 KiB are refused before decoding and routed
			// to the dead-letter topic.
			cfg := strings.Replace(b.cfg(t), "budget:\n", "budget:\n  max_payload_bytes: 65536\n", 1) + retrySection
			ids := burst(t, cfg, 100)
			pub := rawPublisher(t, loadConfig(t, cfg))
			poison := map[string]func(*message.Message){
				"p-garbage":  func(m *message.Message) { m.Payload = []byte("garbage") },
				"p-no-count": func(m *message.Message) { m.Payload = []byte(`{"orderId":1}`) },
				"p-oversize": func(m *message.Message) { m.Payload = []byte(square(20000)) },
			}
			forged := map[string]string{
				"f-huge":     "9223372036854775807",
				"f-negative": "-3",
				"f-text":     "many",
			}
			for id, set := range poison {
				m := message.NewMessage(id, nil)
				set(m)
				if err := pub.Publish(topic, m); err != nil {
					t.Fatal(err)
				}
			}
			for id, v := range forged {
				m := message.NewMessage(id, []byte(square(5)))
				m.Metadata.Set("vertex_count", v)
				if err := pub.Publish(topic, m); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			dlq := collect(t, cfg, "dlq-reader", topic+".dead_letter")
			c := crashtest.Start(t, crashtest.Options{Config: cfg, Topic: topic, PerVertex: 100 * time.Microsecond,
				Decode: true, Env: []string{"SPILLWAY_REDIS_CONSUMER=poison"}})
			account(t, ids, 60*time.Second, nil, c)
			deadline := time.Now().Add(30 * time.Second)
			for id := range poison {
				for !dlq.has(id) {
					if time.Now().After(deadline) {
						j := c.Journal()
						t.Fatalf("%s not dead-lettered after 30s (started %d times)", id, j.Started[id])
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			time.Sleep(500 * time.Millisecond) // anything still looping shows now
			j := c.Journal()
			for id := range poison {
				if n := j.Started[id]; n > 3 {
					t.Errorf("%s started %d times, want at most 3 (max_attempts)", id, n)
				}
			}
		})
	}
}
