package router

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// isSettled reports whether Watermill has acked or nacked msg.
func isSettled(msg *message.Message) bool {
	return settleEntry{acked: msg.Acked(), nacked: msg.Nacked()}.settled()
}

// The settling layer follows a message until it is acked or nacked, but
// does not keep it: once settled and dropped by everyone else, a message's
// payload is garbage however long its entry waits for the next prune.
// (Keeping the messages kept up to a few hundred settled payloads alive,
// heavy geometries beyond what the vertex budget admits.)
func TestSettlingKeepsNoPayload(t *testing.T) {
	var s settling
	h := s.layer(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	const n = 300
	var freed atomic.Int64
	for i := range n {
		payload := make([]byte, 64<<10)
		runtime.AddCleanup(&payload[0], func(struct{}) { freed.Add(1) }, struct{}{})
		msg := message.NewMessage("m", payload)
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			msg.Ack()
		} else {
			msg.Nack()
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for freed.Load() < n && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if got := freed.Load(); got < n {
		t.Errorf("%d of %d settled payloads still reachable", n-got, n)
	}
	if left, _ := s.wait(time.Now()); left != 0 {
		t.Errorf("%d messages unsettled, want 0", left)
	}
}

// The settling layer's counts: a message counts as unsettled from the
// moment it enters the stack until it is acked or nacked, once, whichever
// of the sixteen shards it lands in.
func TestSettlingCounts(t *testing.T) {
	var s settling
	inside := make(chan struct{})
	release := make(chan struct{})
	h := s.layer(func(*message.Message) ([]*message.Message, error) {
		inside <- struct{}{}
		<-release
		return nil, nil
	})
	const n = 64 // spread over the shards
	msgs := make([]*message.Message, n)
	done := make(chan struct{})
	for i := range msgs {
		msgs[i] = message.NewMessage("m", nil)
		go func() {
			_, _ = h(msgs[i])
			done <- struct{}{}
		}()
		<-inside
	}
	if got, _ := s.count(); got != n {
		t.Fatalf("%d unsettled with %d in the stack", got, n)
	}
	if got := s.inFlight(); got != n {
		t.Fatalf("%d in flight, want %d", got, n)
	}
	close(release)
	for range msgs {
		<-done
	}
	if got := s.inFlight(); got != 0 {
		t.Fatalf("%d in flight after every message left, want 0", got)
	}
	if got, _ := s.count(); got != n {
		t.Fatalf("%d unsettled before any ack, want %d", got, n)
	}
	for i, msg := range msgs {
		if i%2 == 0 {
			msg.Ack()
		} else {
			msg.Nack()
		}
	}
	if got, running := s.wait(time.Now().Add(5 * time.Second)); got != 0 || running != 0 {
		t.Fatalf("%d unsettled (%d running) after every ack and nack, want 0", got, running)
	}
}

// Close reports a handler that outlives close_timeout, and the message it
// leaves unacknowledged.
func TestCloseReportsOverrunningHandler(t *testing.T) {
	r, err := New(Config{Broker: brokerMemory, CloseTimeout: 300 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	if _, err := r.AddConsumerHandler("stuck", "jobs", func(*message.Message) error {
		started <- struct{}{}
		<-release
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	publishCosted(t, r, "jobs", "j1", 10)
	<-started
	if got, running := r.settling.count(); got != 1 || running != 1 {
		t.Fatalf("counts %d unsettled, %d running with one handler running; want 1, 1", got, running)
	}
	err = r.Close()
	if err == nil {
		t.Fatal("Close returned nil with a handler still running past close_timeout")
	}
	for _, want := range []string{"1 admitted messages still running after 300ms", "1 messages still unacknowledged after 300ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Close: %v; want it to say %q", err, want)
		}
	}
}
