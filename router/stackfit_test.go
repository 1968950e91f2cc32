//go:build !stackprobe

package router

import (
	"runtime"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/stackprobe"
)

// A stack that the router does not grow at the top (fitsStartingStack)
// must run a message within the stack Watermill's message goroutine starts
// with, or every message grows it, deeper and dearer than at the top.
// Measured two ways, on the memory broker, on Kafka's partition mode and
// on Redis, with telemetry off and on (no providers installed: the tracing
// middleware starts no span and the meter is idle):
//
//   - how deep the stack reaches (a stackprobe.Probe), against a bound
//     (maxLeanDepth): the depth of each build's frames, so a change that
//     makes the stack deeper shows before it makes it grow;
//   - whether the runtime grows (moves) the stack while a message runs
//     (stackprobe.Moves): what the bound stands for, on the stack a
//     message goroutine really starts with. Not under the race detector,
//     whose frames are larger (make test runs this test without it too).
//
// The control, a stack with the retry gate, is grown at the top by the
// tracing middleware: the probe must see its 2 KiB frame and the stack
// must move under Moves, or the other rows would pass by chance.
func TestLeanStackFitsStartingStack(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("frame sizes are measured on amd64, not %s", runtime.GOARCH)
	}
	kafka := kafkatest.Start(t, 2)
	redis := redistest.Start(t)
	const n = 200
	for _, c := range []struct {
		name      string
		broker    Broker
		telemetry bool
		control   bool
	}{
		{"memory/telemetry=off", BrokerMemory, false, false},
		{"kafka/telemetry=off", BrokerKafka, false, false},
		{"memory/telemetry=on", BrokerMemory, true, false},
		{"kafka/telemetry=on", BrokerKafka, true, false},
		{"redis/telemetry=off", BrokerRedis, false, false},
		{"control/retry-gate", BrokerMemory, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := func() Config {
				cfg := Config{Broker: c.broker}
				cfg.Telemetry.Disabled = !c.telemetry
				cfg.Retry.Disabled = !c.control
				if c.broker == BrokerKafka {
					probeKafka(&cfg, kafka.Brokers(), 2)
					cfg.Kafka.HeartbeatInterval = 200 * time.Millisecond
				}
				if c.broker == BrokerRedis {
					cfg.Redis.Addr = redis.Addr()
					cfg.Redis.BlockTime = 50 * time.Millisecond
				}
				return cfg
			}
			probe := runProbed(t, cfg(), n, func(r *Router) {
				if fits := r.fitsStartingStack(); fits == c.control {
					t.Fatalf("fitsStartingStack: %v, want %v", fits, !c.control)
				}
				if r.settling.reserve != (!c.telemetry && c.control) {
					t.Fatalf("the settling layer grows the stack: %v", r.settling.reserve)
				}
				if quiet := r.budgetQuiet != nil; quiet != (c.telemetry && !c.control) {
					t.Fatalf("quiet budget: %v, want %v", quiet, c.telemetry && !c.control)
				}
			})
			median, deepest, got := probe.Depths()
			t.Logf("median depth %d bytes, deepest %d, over %d messages; room %d", median, deepest, got, stackprobe.Room)
			switch {
			case got == 0:
				t.Fatalf("no message measured (%d moved under the probe)", probe.Moved())
			case !c.control && median > maxLeanDepth:
				t.Errorf("the stack reaches %d bytes deep; it must stay within %d (stackprobe.Room is %d), or the router must grow it at the top again",
					median, maxLeanDepth, stackprobe.Room)
			case c.control && median < 2<<10:
				t.Errorf("control: the probe measured %d bytes with the tracing middleware's growth in the stack, want at least 2 KiB", median)
			}
			if !checkMoves {
				return
			}
			var moves stackprobe.Moves
			stackprobe.QuietRuntime(t)
			runWithOuter(t, cfg(), n, moves.Middleware, nil)
			moved, ran := moves.Counts()
			t.Logf("the stack moved for %d of %d messages", moved, ran)
			// A few messages take rarer, deeper paths (a partition's
			// first message, a garbage collection's assist).
			if !c.control && moved > ran/10 {
				t.Errorf("the stack moved for %d of %d messages: the stack no longer fits in a new goroutine's", moved, ran)
			}
			if c.control && moved < ran/2 {
				t.Errorf("control: the stack moved for %d of %d messages, want most", moved, ran)
			}
		})
	}
}

// BenchmarkStackMoves reports the share of messages whose stack the
// runtime moved (stackprobe.Moves) on Kafka's partition mode with telemetry
// on, a stack that fits: the rare paths that still outgrow the stack a
// message goroutine starts with (the allocator's slow paths among them).
//
//	go test -run '^$' -bench StackMoves -benchtime 50000x -count 2 ./router/
func BenchmarkStackMoves(b *testing.B) {
	kafka := kafkatest.Start(b, 2)
	cfg := Config{Broker: BrokerKafka}
	probeKafka(&cfg, kafka.Brokers(), 12)
	var moves stackprobe.Moves
	runWithOuter(b, cfg, b.N, moves.Middleware, nil)
	moved, n := moves.Counts()
	b.ReportMetric(float64(moved)/float64(n), "moved/msg")
	b.ReportMetric(0, "ns/op")
}
