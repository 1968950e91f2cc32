//go:build !stackprobe

package router

import (
	"runtime"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/internal/stackprobe"
)

// A stack that the router does not grow at the top (fitsStartingStack)
// must run a message within the stack Watermill's message goroutine starts
// with, or every message grows it, deeper and dearer than at the top. The
// probe measures how deep the stack reaches (internal/stackprobe) on the
// memory broker and on Kafka's partition mode, without telemetry. The
// control, with telemetry, must measure the tracing middleware's growth
// (its 2 KiB frame) far below the room: a probe that saw nothing would
// pass the others by chance. Frame sizes are those of amd64; the race
// detector's are larger, and its bound (maxLeanDepth) only keeps them from
// growing.
func TestLeanStackFitsStartingStack(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("frame sizes are measured on amd64, not %s", runtime.GOARCH)
	}
	kafka := kafkatest.Start(t, 2)
	for _, c := range []struct {
		name     string
		broker   Broker
		disabled bool
	}{
		{"memory", BrokerMemory, true},
		{"kafka", BrokerKafka, true},
		{"control-telemetry", BrokerMemory, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{Broker: c.broker}
			cfg.Telemetry.Disabled = c.disabled
			if c.broker == BrokerKafka {
				cfg.Kafka.Brokers = kafka.Brokers()
				cfg.Kafka.Version = "2.3.0" // kfake's limit
				cfg.Kafka.Partitions = 2
				cfg.Kafka.CreateTopics = true
				cfg.Kafka.HeartbeatInterval = 200 * time.Millisecond
			}
			probe := runProbed(t, cfg, 200, func(r *Router) {
				if fits := !r.settling.reserve && r.tracing == nil; fits != c.disabled {
					t.Fatalf("the settling layer grows the stack: %v, want %v", !fits, !c.disabled)
				}
			})
			median, deepest, got := probe.Depths()
			t.Logf("%s: median depth %d bytes, deepest %d, over %d messages; room %d", c.name, median, deepest, got, stackprobe.Room)
			switch {
			case got == 0:
				t.Fatalf("no message measured (%d moved under the probe)", probe.Moved())
			case c.disabled && median > maxLeanDepth:
				t.Errorf("the stack reaches %d bytes deep; it must stay within %d (stackprobe.Room is %d), or the router must grow it at the top again",
					median, maxLeanDepth, stackprobe.Room)
			case !c.disabled && median < 2<<10:
				t.Errorf("control: the probe measured %d bytes with the tracing middleware's growth in the stack, want at least 2 KiB", median)
			}
		})
	}
}
