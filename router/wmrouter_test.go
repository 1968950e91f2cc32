package router

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// TestWithWatermillRouter: on a Watermill router of the user's, New adds
// the whole stack (a handler added through the Router is admitted against
// the budget and retried by the gate), a middleware the user added before
// New runs outside it, and Run refuses a handler added to the Watermill
// router directly. A running router is refused at New.
func TestWithWatermillRouter(t *testing.T) {
	t.Run("stack", func(t *testing.T) {
		wm, err := message.NewRouter(message.RouterConfig{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var order []string
		note := func(s string) {
			mu.Lock()
			order = append(order, s)
			mu.Unlock()
		}
		wm.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				note("user")
				return h(msg)
			}
		})
		r, err := New(Config{}, nil, WithWatermillRouter(wm))
		if err != nil {
			t.Fatal(err)
		}
		if r.wm != wm {
			t.Fatal("the router does not run on the given Watermill router")
		}
		done := make(chan struct{})
		var calls atomic.Int64
		if _, err := r.AddConsumerHandler("h", "t", func(msg *message.Message) error {
			note("handler")
			if calls.Add(1) == 1 { // fails once: the gate retries it
				return errIndex
			}
			close(done)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		startRouter(t, r)
		if err := r.Publisher().Publish("t", message.NewMessage("m", pingPayload(0))); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("not handled; order %v", order)
		}
		mu.Lock()
		got := strings.Join(order, " ")
		mu.Unlock()
		if got != "user handler handler" {
			t.Errorf("calls %q, want the user's middleware once, outside the gate, and the handler twice", got)
		}
		if st := r.Stats(); st.Budget.Admitted != 2 || st.Retry == nil || st.Retry.Retries != 1 {
			t.Errorf("stats %+v, retry %+v: want two admissions and one retry", st.Budget, st.Retry)
		}
	})
	t.Run("direct handler", func(t *testing.T) {
		wm, err := message.NewRouter(message.RouterConfig{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := New(Config{}, nil, WithWatermillRouter(wm))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if _, err := r.AddConsumerHandler("ok", "t", func(*message.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
		wm.AddConsumerHandler("sneaky", "t", r.back.(*memoryBackend).ch, func(*message.Message) error { return nil })
		errc := make(chan error, 1)
		go func() { errc <- r.Run(context.Background()) }()
		select {
		case err := <-errc:
			if err == nil || !strings.Contains(err.Error(), "sneaky") || strings.Contains(err.Error(), "ok,") {
				t.Errorf("Run = %v, want an error naming sneaky alone", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run ran with a handler added to the Watermill router directly")
		}
	})
	t.Run("running", func(t *testing.T) {
		wm, err := message.NewRouter(message.RouterConfig{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = wm.Run(context.Background()) }()
		<-wm.Running()
		defer wm.Close()
		if _, err := New(Config{}, nil, WithWatermillRouter(wm)); err == nil {
			t.Error("New took a running Watermill router")
		}
	})
	// New fails at its last step here, after the broker was opened: it
	// closes the broker's publisher on the way out.
	t.Run("refused closes the broker", func(t *testing.T) {
		wm, err := message.NewRouter(message.RouterConfig{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := wm.Close(); err != nil {
			t.Fatal(err)
		}
		ch := gochannel.NewGoChannel(gochannel.Config{}, nil)
		defer ch.Close()
		var closes closeCounter
		b := CustomBroker{Publisher: countedPublisher{ch, &closes}, Subscriber: func(string, string) (message.Subscriber, error) { return ch, nil }}
		if _, err := New(Config{}, nil, WithBroker(b), WithWatermillRouter(wm)); err == nil {
			t.Fatal("New took a closed Watermill router")
		}
		if n := closes.n.Load(); n != 1 {
			t.Errorf("the broker's publisher was closed %d times, want 1", n)
		}
	})
}
