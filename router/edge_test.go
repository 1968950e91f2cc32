package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// settleWatch is a subscriber that remembers every message it hands out
// and, when it is closed, how many of them were neither acked nor nacked.
type settleWatch struct {
	message.Subscriber
	mu          sync.Mutex
	handed      []*message.Message
	unsettledAt int
	closed      bool
}

func (s *settleWatch) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for m := range in {
			s.mu.Lock()
			s.handed = append(s.handed, m)
			s.mu.Unlock()
			out <- m
		}
	}()
	return out, nil
}

func (s *settleWatch) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		for _, m := range s.handed {
			if !isSettled(m) {
				s.unsettledAt++
			}
		}
	}
	s.mu.Unlock()
	return s.Subscriber.Close()
}

// slowOutput publishes to the output topic slowly, as a remote broker under
// load would, and the rest at once.
type slowOutput struct {
	message.Publisher
	topic string
	delay time.Duration
}

func (p slowOutput) Publish(topic string, msgs ...*message.Message) error {
	if topic == p.topic {
		time.Sleep(p.delay)
	}
	return p.Publisher.Publish(topic, msgs...)
}

// Close waits for Watermill to publish a handler's output and ack the
// message before it closes the subscriber: otherwise the ack of finished
// work is lost and the broker redelivers it (issue 13, item 4).
func TestEdgeCloseWaitsForAck(t *testing.T) {
	ch := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	watch := &settleWatch{Subscriber: ch}
	r, err := New(Config{CloseTimeout: 10 * time.Second}, nil, WithBroker(CustomBroker{
		Publisher:  slowOutput{Publisher: ch, topic: "out", delay: 300 * time.Millisecond},
		Subscriber: func(string, string) (message.Subscriber, error) { return watch, nil },
	}))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{})
	if _, err := r.AddHandler("h", "in", "out", func(msg *message.Message) ([]*message.Message, error) {
		close(ran)
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{"type":"Point","coordinates":[0,0]}`))}, nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "in", "m", 10)
	<-ran
	closeRouter(t, r, errc)
	watch.mu.Lock()
	defer watch.mu.Unlock()
	if len(watch.handed) == 0 {
		t.Fatal("the subscriber handed out nothing")
	}
	if watch.unsettledAt != 0 {
		t.Errorf("%d of %d messages neither acked nor nacked when the subscriber was closed", watch.unsettledAt, len(watch.handed))
	}
	if !isSettled(watch.handed[0]) {
		t.Error("the message was never acked")
	}
}
