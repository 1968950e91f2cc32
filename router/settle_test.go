package router

import (
	"runtime"
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
	if left := s.wait(time.Now()); left != 0 {
		t.Errorf("%d messages unsettled, want 0", left)
	}
}
