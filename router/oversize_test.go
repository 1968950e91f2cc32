package router

import (
	"bytes"
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/retrygate"
)

// Issue 13, items 8 and 15: a payload above budget.max_payload_bytes, or a
// charge above budget.max_message_vertices (a message too big to finish
// alone inside the deadline), was clamped and run alone. It now takes the
// oversize path: budget.oversize_topic, else the dead-letter topic (through
// the retry gate when it is on, by the router when it is off), and the good
// messages keep flowing.
func TestEdgeRouterOversizeRouted(t *testing.T) {
	for _, tt := range []struct {
		name      string
		retry     bool
		oversize  string
		wantTopic string
		wantCause string
	}{
		{"dead letter by the router", false, "", "shapes.dead_letter", "oversize"},
		{"dead letter by the retry gate", true, "", "shapes.dead_letter", "permanent"},
		{"oversize topic", true, "shapes.oversize", "shapes.oversize", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Broker: BrokerMemory}
			cfg.Budget.Vertices = 10_000
			cfg.Budget.MaxPayloadBytes = 4 << 10
			cfg.Budget.MaxMessageVertices = 1_000
			cfg.Budget.OversizeTopic = tt.oversize
			cfg.Retry.Enabled = tt.retry
			cfg.Telemetry.Disabled = true
			r, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			var handled atomic.Int64
			if _, err := r.AddConsumerHandler("sink", "shapes", func(msg *message.Message) error {
				handled.Add(1)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			sub, _, err := r.back.subscriber("watch", tt.wantTopic)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			routed, err := sub.Subscribe(ctx, tt.wantTopic)
			if err != nil {
				t.Fatal(err)
			}
			startRouter(t, r)

			pub := r.back.publisher() // raw: the test sets the headers itself
			send := func(id string, payload []byte, vertices int) {
				msg := message.NewMessage(id, payload)
				msg.Metadata.Set(cost.MetadataKey, strconv.Itoa(vertices))
				if err := pub.Publish("shapes", msg); err != nil {
					t.Fatal(err)
				}
			}
			send("good-1", []byte(`{"type":"Point","coordinates":[1,2]}`), 1)
			send("too-big", bytes.Repeat([]byte(" "), 8<<10), 1)
			send("too-many", []byte(`{}`), 5_000) // above max_message_vertices, below the budget
			send("good-2", []byte(`{"type":"Point","coordinates":[1,2]}`), 1)

			got := map[string]string{}
			timeout := time.After(10 * time.Second)
			for len(got) < 2 {
				select {
				case m := <-routed:
					got[m.UUID] = m.Metadata.Get(retrygate.DeadLetterCauseKey)
					m.Ack()
				case <-timeout:
					t.Fatalf("routed %v to %s, want too-big and too-many", got, tt.wantTopic)
				}
			}
			for _, id := range []string{"too-big", "too-many"} {
				if cause, ok := got[id]; !ok || cause != tt.wantCause {
					t.Errorf("%s: routed %v, cause %q; want cause %q", id, ok, cause, tt.wantCause)
				}
			}
			waitFor(t, "both good messages handled", func() bool { return handled.Load() == 2 })
			time.Sleep(50 * time.Millisecond)
			if n := handled.Load(); n != 2 {
				t.Errorf("handler ran %d times, want 2 (the oversize messages never reach it)", n)
			}
		})
	}
}
