package redisbroker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// chainSubscriber runs every message through the given middlewares the way
// a router would, while the suite reads and acks it: the middleware chain's
// handler hands the message to the suite and returns when it is acked or
// nacked. So the suite exercises the subscriber as Spillway deploys it, with
// the dead-letter middleware in the chain.
//
// Close closes the subscriber and then waits until every channel Subscribe
// returned is closed, as the suite expects of any subscriber: the
// forwarding goroutines close their channel only after the subscriber's
// own channel has closed and their in-flight handlers have returned.
type chainSubscriber struct {
	*redisbroker.Subscriber
	mws     []message.HandlerMiddleware
	forward *sync.WaitGroup
}

func (c chainSubscriber) Close() error {
	err := c.Subscriber.Close()
	c.forward.Wait()
	return err
}

func (c chainSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := c.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	deliver := func(msg *message.Message) ([]*message.Message, error) {
		select {
		case out <- msg:
		case <-msg.Context().Done():
			return nil, msg.Context().Err()
		}
		select {
		case <-msg.Acked():
			return nil, nil
		case <-msg.Nacked():
			return nil, errNacked
		case <-msg.Context().Done():
			return nil, msg.Context().Err()
		}
	}
	h := message.HandlerFunc(deliver)
	for i := len(c.mws) - 1; i >= 0; i-- {
		h = c.mws[i](h)
	}
	c.forward.Add(1)
	go func() {
		defer c.forward.Done()
		var wg sync.WaitGroup
		for msg := range in {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := h(msg); err != nil {
					msg.Nack()
				} else {
					msg.Ack()
				}
			}()
		}
		wg.Wait()
		close(out)
	}()
	return out, nil
}

// The Watermill universal Pub/Sub suite over the Spillway publisher and
// subscriber (4 consumers per subscriber, keep-alive on, the dead-letter
// middleware in the chain). Features as upstream declares them, except
// GuaranteedOrderWithSingleSubscriber: with several consumers per
// subscriber, one subscriber does not preserve order. (Upstream declares
// GuaranteedOrder false, so the order tests are skipped either way.)
//
// Scope: without -race the suite runs at full size (about 20 s here). With
// -race it runs in the suite's own short mode (ForceShort: 10-100x fewer
// messages and subscribers), because TestConcurrentSubscribe alone then
// takes over a minute: every subscriber the suite builds has its own
// consumer group and re-reads the whole 5,000-message stream, so it moves
// ~250,000 deliveries.
func TestUniversalPubSub(t *testing.T) {
	srv := redistest.Start(t)
	features := tests.Features{
		ConsumerGroups:                      true,
		ExactlyOnceDelivery:                 false,
		GuaranteedOrder:                     false,
		GuaranteedOrderWithSingleSubscriber: false,
		Persistent:                          true,
		RequireSingleInstance:               false,
		NewSubscriberReceivesOldMessages:    true,
		ForceShort:                          raceEnabled,
	}
	build := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		cfg := redisbroker.Config{
			Addr:          srv.Addr(),
			ConsumerGroup: group,
			Consumer:      uniq("c"),
			Consumers:     4,
			BlockTime:     10 * time.Millisecond,
			ClaimInterval: 3 * time.Second,
			MaxIdleTime:   5 * time.Second,
		}
		pub, err := redisbroker.NewPublisher(cfg)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := redisbroker.NewSubscriber(cfg, redisbroker.WithLogger(testLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		dlPub, err := redisbroker.NewPublisher(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dlPub.Close() })
		dl, err := redisbroker.NewDeadLetter(cfg, redisbroker.WithPublisher(dlPub))
		if err != nil {
			t.Fatal(err)
		}
		return pub, chainSubscriber{Subscriber: sub, mws: []message.HandlerMiddleware{dl.Middleware}, forward: new(sync.WaitGroup)}
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return build(t, uniq("suite")) },
		build,
	)
}
