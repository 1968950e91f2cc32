package router

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/telemetry"
)

// CustomBroker plugs any Watermill publisher and subscribers into a
// [Router] (NATS JetStream, AMQP, SQL, …): give it to [WithBroker]. The
// whole stack runs over it unchanged: stamping and tracing publisher,
// budget, shedding, retry gate, telemetry, and the auto-sizer, which sizes
// the budget against RedeliveryDeadline.
//
// The router owns what it is given once [New] has validated it: Close
// closes the publisher and every subscriber Subscriber returned (each
// once), then calls the Close field, and so does a New that fails later
// on; a New that fails validation leaves them alone. When one value serves
// several of these roles (one GoChannel as publisher and subscriber), its
// Close must tolerate being called more than once.
type CustomBroker struct {
	// Publisher is the broker's publisher. Required.
	Publisher message.Publisher

	// Subscriber returns the subscriber for the handler named handler,
	// which consumes topic. It is called once per handler, and once more
	// for its retry handler (named "<handler>.retry", topic retry.retry_topic)
	// unless retry.disabled. Handlers of one consumer group share its
	// deliveries, so each handler should get its own group (or durable
	// consumer, queue…), as the router does on Kafka and Redis. Required.
	Subscriber func(handler, topic string) (message.Subscriber, error)

	// RedeliveryDeadline is how long a delivered but unacknowledged
	// message may stay in flight before the broker hands it to someone
	// else: JetStream's AckWait, an SQS visibility timeout, an AMQP
	// consumer timeout. The budget is sized against it
	// ([Config.RedeliveryDeadline] returns it, budget.autosize uses it) and
	// the retry gate is kept within it. 0 means the broker has none, as on
	// memory: budget.autosize.deadline must then be set to auto-size.
	RedeliveryDeadline time.Duration

	// Lag, if set, reads the consumer lag ([Router.Lag], the lag metrics,
	// shedding.pressure lag, producer.lag_throttle). Without it the lag is
	// unknown ([ErrLagUnknown]) and the settings that need it are
	// rejected.
	Lag telemetry.LagSource

	// Close, if set, is called last by Router.Close, after the publisher
	// and the subscribers, to release what they share: a connection, a
	// pool.
	Close func() error
}

// WithBroker runs the router on b instead of a built-in broker. It selects
// broker custom when Config.Broker is empty; with broker: custom in the
// configuration it is required, and with any other broker it is an error.
func WithBroker(b CustomBroker) Option {
	return func(o *options) { o.custom = &b }
}

// validateCustom checks WithBroker against the configuration.
func (o options) validateCustom(cfg Config) []error {
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &spillway.FieldError{Field: field, Value: value, Reason: reason})
	}
	switch {
	case cfg.Broker == brokerCustom && o.custom == nil:
		bad("broker", cfg.Broker, "needs router.WithBroker: a custom broker is code (a Watermill publisher and subscribers), not configuration")
		return errs
	case cfg.Broker != brokerCustom && o.custom != nil:
		bad("broker", cfg.Broker, "must be custom, or left unset, with router.WithBroker")
		return errs
	case o.custom == nil:
		return nil
	}
	b := o.custom
	if b.Publisher == nil {
		bad("broker", "custom", "router.WithBroker: CustomBroker.Publisher is required")
	}
	if b.Subscriber == nil {
		bad("broker", "custom", "router.WithBroker: CustomBroker.Subscriber is required")
	}
	if b.RedeliveryDeadline < 0 {
		bad("broker", "custom", "router.WithBroker: CustomBroker.RedeliveryDeadline must be zero (none) or positive, got "+b.RedeliveryDeadline.String())
	}
	if b.Lag == nil {
		if p := cfg.Shedding.Pressure; p == pressureLag || p == pressureEither {
			bad("shedding.pressure", p, "needs the consumer lag: set CustomBroker.Lag")
		}
		if t := cfg.Producer.LagThrottle.Threshold; t > 0 {
			bad("producer.lag_throttle.threshold", strconv.FormatInt(t, 10), "needs the consumer lag: set CustomBroker.Lag")
		}
	}
	return errs
}

// customBackend runs the router on a [CustomBroker].
type customBackend struct {
	noExtras
	b CustomBroker

	mu   sync.Mutex
	subs []*onceSubscriber
}

func (c *customBackend) publisher() message.Publisher { return c.b.Publisher }

func (c *customBackend) subscriber(handler, topic string) (message.Subscriber, deliveryTracker, error) {
	sub, err := c.b.Subscriber(handler, topic)
	if err != nil {
		return nil, nil, fmt.Errorf("router: custom: subscriber for %s: %w", handler, err)
	}
	if sub == nil {
		return nil, nil, fmt.Errorf("router: custom: CustomBroker.Subscriber returned no subscriber for %s", handler)
	}
	s := &onceSubscriber{Subscriber: sub}
	c.mu.Lock()
	c.subs = append(c.subs, s)
	c.mu.Unlock()
	return s, nil, nil
}

// group is "": the router does not know the custom broker's groups.
func (c *customBackend) group(string) string { return "" }

func (c *customBackend) ensureTopic(string) error { return nil }

func (c *customBackend) lag(ctx context.Context, _ []groupTopic) ([]telemetry.LagSample, error) {
	if c.b.Lag == nil {
		return nil, ErrLagUnknown
	}
	return c.b.Lag(ctx)
}

func (c *customBackend) estimateBacklog(context.Context, []telemetry.LagSample, int64) ([]vertexEstimate, error) {
	return nil, ErrLagUnknown
}

func (c *customBackend) deadLetter(func(*message.Message, bool)) message.HandlerMiddleware {
	return nil
}

// system is watermill; WithTelemetry(telemetry.WithMessagingSystem(…))
// names the custom broker's system.
func (c *customBackend) system() string { return "watermill" }

// close closes every subscriber not closed yet (Watermill closes a
// handler's subscriber from a goroutine of its own, which Watermill's
// Close does not wait for), then calls CustomBroker.Close. The router has
// closed the publisher already.
func (c *customBackend) close() error {
	c.mu.Lock()
	subs := c.subs
	c.subs = nil
	c.mu.Unlock()
	var errs []error
	for _, s := range subs {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.b.Close != nil {
		if err := c.b.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// onceSubscriber closes its subscriber once, however often it is closed,
// and reports that first error every time.
type onceSubscriber struct {
	message.Subscriber
	once sync.Once
	err  error
}

func (s *onceSubscriber) Close() error {
	s.once.Do(func() { s.err = s.Subscriber.Close() })
	return s.err
}
