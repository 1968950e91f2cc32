package redisbroker_test

import (
	"testing"

	"github.com/spillway-go/spillway/internal/redistest"
)

// A message acked just before Close is acknowledged in Redis (XACK) before
// the subscriber's connections go: Close never cancels an XACK that an Ack
// already asked for, so finished work is not redelivered (issue 13, item 4).
func TestEdgeAckThenClose(t *testing.T) {
	srv := redistest.Start(t)
	raw := rawClient(t, srv)
	const rounds = 40
	for i := range rounds {
		cfg := testConfig(srv)
		cfg.Consumers = 1
		topic := uniq("ack-close")
		publish(t, newPublisher(t, cfg), topic, "m")
		sub := newSubscriber(t, cfg)
		msgs, err := sub.Subscribe(testCtx(t), topic)
		if err != nil {
			t.Fatal(err)
		}
		msg := <-msgs
		msg.Ack()
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
		n, err := raw.XPending(testCtx(t), topic, cfg.ConsumerGroup).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n.Count != 0 {
			t.Fatalf("round %d: %d entries still pending after Ack then Close", i, n.Count)
		}
	}
}
