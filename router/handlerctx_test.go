package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/retrygate"
)

// TestRetryHandlerContext: under the retry gate, the handler's context
// carries the attempt, lasts while the handler runs even once Close has
// started (admitted work is not interrupted), ends when the delivery's own
// context ends, and ends once the handler has returned.
func TestRetryHandlerContext(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := Config{Broker: brokerMemory, CloseTimeout: 10 * time.Second}
	cfg.Telemetry.Disabled = true
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	type seen struct {
		ctx     context.Context
		attempt int
		live    error
	}
	got := make(chan seen, 1)
	release := make(chan struct{})
	h := r.chain(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		got <- seen{ctx, retrygate.AttemptFromCtx(ctx), ctx.Err()}
		<-release
		return nil, nil
	})
	run := func(life context.Context) <-chan struct{} {
		msg := message.NewMessage("m", nil)
		msg.Metadata.Set("vertex_count", "1")
		msg.SetContext(life)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = h(msg)
			msg.Ack()
		}()
		return done
	}
	ended := func(ctx context.Context) bool {
		select {
		case <-ctx.Done():
			return ctx.Err() != nil
		case <-time.After(5 * time.Second):
			return false
		}
	}

	// The delivery's own context ends while the handler runs.
	life, cancelLife := context.WithCancel(context.Background())
	done := run(life)
	s := <-got
	if s.attempt != 1 || s.live != nil {
		t.Fatalf("attempt %d, Err %v while running; want 1, nil", s.attempt, s.live)
	}
	cancelLife()
	if !ended(s.ctx) {
		t.Fatal("the handler's context did not end with the delivery's")
	}
	release <- struct{}{}
	<-done

	// Close starts while the handler runs: its context lives on until it
	// returns.
	life, cancelLife = context.WithCancel(context.Background())
	defer cancelLife()
	done = run(life)
	s = <-got
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	for r.closingCtx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	select {
	case <-s.ctx.Done():
		t.Fatalf("Close ended the running handler's context: %v", s.ctx.Err())
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-done
	if !ended(s.ctx) || !errors.Is(s.ctx.Err(), context.Canceled) {
		t.Fatalf("the handler's context did not end after the handler returned: %v", s.ctx.Err())
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
