package router

import (
	"context"
	"runtime"
	"testing"
	"unsafe"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/stackroom"
)

// TestStackDepthUnderHandler measures how much of the message goroutine's
// stack the default middleware stack holds while the handler runs: the
// distance from the settling layer's caller to a local of the handler.
// Watermill starts every message on a goroutine of its own, with a small
// stack; the first layer grows it once, at the top (internal/stackroom:
// the tracing middleware, or the settling layer without telemetry), and
// what the layers keep below that is taken from the handler's room
// before the stack has to grow again. Frames that grow back (a layer doing
// its work inline in its closure again) fail it.
func TestStackDepthUnderHandler(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("frame sizes are measured on amd64, not %s", runtime.GOARCH)
	}
	// The lean stacks: no optional layer, the retry gate off.
	t.Run("memory", func(t *testing.T) {
		stackDepthUnderHandler(t, Config{Broker: BrokerMemory, Retry: RetryConfig{Disabled: true}}, maxStackUnderHandler)
	})
	t.Run("redis", func(t *testing.T) {
		cfg := Config{Broker: BrokerRedis, Retry: RetryConfig{Disabled: true}}
		// New pings Redis; the stack is then built and called directly.
		cfg.Redis.Addr = redistest.Start(t).Addr()
		stackDepthUnderHandler(t, cfg, maxStackUnderHandlerRedis)
	})
}

func stackDepthUnderHandler(t *testing.T, cfg Config, bound uintptr) {
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	var handlerAt uintptr
	h := func(msg *message.Message) ([]*message.Message, error) {
		var local byte
		handlerAt = uintptr(unsafe.Pointer(&local))
		return nil, nil
	}
	h = r.chain(h)
	msg := message.NewMessage("m", []byte(`{"type":"Point","coordinates":[1,2]}`))
	msg.Metadata.Set("vertex_count", "1")
	msg.SetContext(context.Background())
	var top uintptr
	moved := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Room enough that nothing below grows the stack (which would
		// move it and make the distance meaningless).
		stackroom.ReserveDeep()
		var mark byte
		top = uintptr(unsafe.Pointer(&mark))
		if _, err := h(msg); err != nil {
			t.Error(err)
		}
		moved = uintptr(unsafe.Pointer(&mark)) != top
		msg.Ack() // as Watermill does next: the settling layer waits for it
	}()
	<-done
	if moved || handlerAt == 0 {
		t.Fatalf("the stack moved under the handler (moved %v), or the handler did not run", moved)
	}
	depth := top - handlerAt
	t.Logf("layers %v: %d bytes from the settling layer's caller to the handler", r.Layers(), depth)
	if depth > bound {
		t.Errorf("the stack holds %d bytes between the settling layer and the handler; at most %d", depth, bound)
	}
}

// chain wraps h in r's middleware stack, as Watermill would: the first
// layer outermost.
func (r *Router) chain(h message.HandlerFunc) message.HandlerFunc {
	mws := r.stack().middlewares()
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// The message goroutine's stack is grown once, at the top: by the settling
// layer when there is no tracing layer, else by the tracing middleware
// right inside it (to 8 KiB when its tracer records), never by both, which
// would copy the stack twice (BenchmarkChain/tracer=sdk); and not at all
// by a stack that fits in the stack the goroutine starts with
// (TestLeanStackFitsStartingStack).
func TestSettlingReservesOnlyWithoutTracing(t *testing.T) {
	for _, c := range []struct {
		name     string
		disabled bool
		retry    bool
		want     bool
	}{
		{"telemetry", false, false, false},
		{"lean", true, false, false},
		{"retry-gate", true, true, true},
	} {
		cfg := Config{Broker: BrokerMemory}
		cfg.Telemetry.Disabled = c.disabled
		cfg.Retry.Disabled = !c.retry
		r, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.settling.reserve; got != c.want || (r.tracing == nil) != c.disabled {
			t.Errorf("%s: settling reserves %v, want %v (tracing layer present: %v)", c.name, got, c.want, r.tracing != nil)
		}
		_ = r.Close()
	}
}
