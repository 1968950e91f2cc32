package redisbroker

import (
	"testing"
	"time"
)

// A Close made while another is still closing the subscriber returns only
// once that one has finished. A Watermill router closes its subscribers as
// it closes, and the subscriber's owner may close it too: a Close that
// returned at once would let the owner tear down what the first is still
// using (the acker, here, still sending its last acks).
func TestSubscriberCloseWaitsForTheFirst(t *testing.T) {
	s, err := NewSubscriber(Config{ConsumerGroup: "g", Consumer: "c", Consumers: 1}, nil, WithClient(unreachableClient(t)))
	if err != nil {
		t.Fatal(err)
	}
	// An ack that cannot reach Redis keeps the first Close in its final
	// flush for flushTimeout.
	s.acker.flushTimeout = 300 * time.Millisecond
	s.acker.enqueue(nil, "s", "c", "1-0")
	first := make(chan struct{})
	go func() {
		_ = s.Close()
		close(first)
	}()
	for {
		s.mu.Lock()
		closing := s.closed
		s.mu.Unlock()
		if closing {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case <-s.keepAlive.done:
	default:
		t.Fatalf("the second Close returned after %s, while the first was still closing", time.Since(start))
	}
	<-first
}
