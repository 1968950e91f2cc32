package router

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/retrygate"
)

// Issue 13, items 8 and 15: a payload above budget.max_payload_bytes, or a
// charge above budget.max_message_vertices (a message too big to finish
// alone inside the deadline), was clamped and run alone. It now takes the
// oversize path: budget.oversize_topic, else the dead-letter topic, and the
// good messages keep flowing.
func TestEdgeRouterOversizeRouted(t *testing.T) {
	for _, tt := range []struct {
		name      string
		retry     bool
		oversize  string
		wantTopic string
		wantCause string
	}{
		{"dead letter by the router", false, "", "shapes.dead_letter", "oversize"},
		{"dead letter with the retry gate on", true, "", "shapes.dead_letter", "oversize"},
		{"oversize topic", true, "shapes.oversize", "shapes.oversize", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Broker: brokerMemory}
			cfg.Budget.Vertices = 10_000
			cfg.Budget.MaxPayloadBytes = 4 << 10
			cfg.Budget.MaxMessageVertices = 1_000
			cfg.Budget.OversizeTopic = tt.oversize
			cfg.Retry.Disabled = !tt.retry
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

// Issue 13, items 8 and 9: the payload cap defaults to what the memory
// bound can decode, and the new limits (and a budget near math.MaxInt64)
// are validated.
func TestEdgeRouterSizeLimitsValidated(t *testing.T) {
	c := Config{}
	c.Budget.AutoSize.MemoryBytes, c.Budget.AutoSize.Processes, c.Budget.AutoSize.BytesPerVertex = 256<<20, 2, 100
	c.setDefaults()
	if want := int64(128<<20) / 64; c.Budget.MaxPayloadBytes != want {
		t.Errorf("max_payload_bytes default with 128 MiB of geometry per process = %d, want %d", c.Budget.MaxPayloadBytes, want)
	}
	for _, tc := range []struct {
		name, field string
		set         func(*Config)
	}{
		{"budget near MaxInt64", "budget.vertices", func(c *Config) { c.Budget.Vertices = math.MaxInt64 }},
		{"payload cap above what can be decoded", "budget.max_payload_bytes", func(c *Config) { c.Budget.MaxPayloadBytes = cost.MaxPayloadBytes + 1 }},
		{"payload cap below -1", "budget.max_payload_bytes", func(c *Config) { c.Budget.MaxPayloadBytes = -2 }},
		{"payload cap above the geometry memory", "budget.max_payload_bytes", func(c *Config) {
			c.Budget.MaxPayloadBytes = 64 << 20
			c.Budget.AutoSize.MemoryBytes, c.Budget.AutoSize.BytesPerVertex = 32<<20, 100
		}},
		{"negative solo limit", "budget.max_message_vertices", func(c *Config) { c.Budget.MaxMessageVertices = -1 }},
		{"blank oversize topic", "budget.oversize_topic", func(c *Config) { c.Budget.OversizeTopic = " " }},
		{"budget above the largest capacity", "budget.vertices", func(c *Config) { c.Budget.Vertices = 1<<40 + 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			tc.set(&c)
			err := c.Validate()
			var fe *spillway.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Errorf("Validate() = %v, want a field error for %s", err, tc.field)
			}
		})
	}
	var ok Config
	ok.Budget.MaxPayloadBytes = spillway.Off
	ok.Budget.Vertices = 1 << 40
	if err := ok.Validate(); err != nil {
		t.Errorf("no payload cap, the largest budget: %v", err)
	}
}
