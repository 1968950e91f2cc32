package router

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/telemetry"
)

// broker maps the section to a redisbroker configuration for the consumer
// group group (each handler has its own; the publisher ignores it).
func (r RedisConfig) broker(group string) redisbroker.Config {
	return redisbroker.Config{
		Addr:     r.Addr,
		Username: r.Username,
		Password: string(r.Password),
		DB:       r.DB,
		TLS: redisbroker.TLSConfig{
			Enabled:            r.TLS.Enabled,
			CAFile:             r.TLS.CAFile,
			CertFile:           r.TLS.CertFile,
			KeyFile:            r.TLS.KeyFile,
			ServerName:         r.TLS.ServerName,
			InsecureSkipVerify: r.TLS.InsecureSkipVerify,
		},
		ConsumerGroup:   group,
		Consumer:        r.Consumer,
		Consumers:       r.Consumers,
		BlockTime:       r.BlockTime,
		ClaimInterval:   r.ClaimInterval,
		MaxIdleTime:     r.MaxIdleTime,
		NackResendSleep: r.NackResendSleep,
		KeepAlive: redisbroker.KeepAliveConfig{
			Interval:    r.KeepAlive.Interval,
			MaxInFlight: r.KeepAlive.MaxInFlight,
			Disabled:    r.KeepAlive.Disabled,
		},
		LagInterval:     r.LagInterval,
		DefaultMaxLen:   r.DefaultMaxLen,
		MaxLen:          maps.Clone(r.MaxLen),
		DeadLetterTopic: r.DeadLetterTopic,
	}
}

// consumerGroup is the Redis consumer group of the handler named handler.
func (r RedisConfig) consumerGroup(handler string) string { return r.ConsumerGroup + "." + handler }

// redisBackend runs each handler as its own redisbroker.Subscriber, in
// its own consumer group, with its own clients; one redisbroker.Publisher
// serves the router. Entries that cannot be unmarshalled are moved to
// redis.dead_letter_topic by the dead-letter layer of the stack.
type redisBackend struct {
	cfg    RedisConfig
	logger watermill.LoggerAdapter
	pub    *redisbroker.Publisher
	dl     *redisbroker.DeadLetter

	mu   sync.Mutex
	subs map[string]*redisbroker.Subscriber // by handler name
}

func newRedisBackend(cfg RedisConfig, logger watermill.LoggerAdapter) (*redisBackend, error) {
	pub, err := redisbroker.NewPublisher(cfg.broker(""), logger)
	if err != nil {
		return nil, fmt.Errorf("router: redis: publisher: %w", err)
	}
	dl, err := redisbroker.NewDeadLetter(redisbroker.DeadLetterConfig{Publisher: pub, Topic: cfg.DeadLetterTopic, Logger: logger})
	if err != nil {
		_ = pub.Close()
		return nil, fmt.Errorf("router: redis: dead letter: %w", err)
	}
	return &redisBackend{cfg: cfg, logger: logger, pub: pub, dl: dl, subs: make(map[string]*redisbroker.Subscriber)}, nil
}

func (b *redisBackend) publisher() message.Publisher { return b.pub }

func (b *redisBackend) subscriber(handler, _ string) (message.Subscriber, *kafkabroker.SessionTracker, error) {
	sub, err := redisbroker.NewSubscriber(b.cfg.broker(b.cfg.consumerGroup(handler)), b.logger)
	if err != nil {
		return nil, nil, fmt.Errorf("router: redis: subscriber for %s: %w", handler, err)
	}
	b.mu.Lock()
	b.subs[handler] = sub
	b.mu.Unlock()
	// A closed subscriber drops out of the lag sum.
	return &redisSubscriber{Subscriber: sub, forget: func() {
		b.mu.Lock()
		if b.subs[handler] == sub {
			delete(b.subs, handler)
		}
		b.mu.Unlock()
	}}, nil, nil
}

// Streams are created with their group when a handler subscribes, and by
// the first XADD otherwise.
func (b *redisBackend) ensureTopic(string) error { return nil }

// lag is each handler group's backlog per stream: entries not yet
// delivered plus entries pending (delivered, not acked).
func (b *redisBackend) lag(ctx context.Context, groups []groupTopic) ([]telemetry.LagSample, error) {
	var out []telemetry.LagSample
	for _, g := range groups {
		b.mu.Lock()
		sub := b.subs[g.handler]
		b.mu.Unlock()
		if sub == nil {
			continue
		}
		samples, err := sub.LagSource().Lag(ctx)
		if err != nil {
			return nil, fmt.Errorf("router: redis: lag of %s: %w", g.handler, err)
		}
		out = append(out, samples...)
	}
	return out, nil
}

func (b *redisBackend) deadLetter() message.HandlerMiddleware { return b.dl.Middleware }

func (b *redisBackend) system() string { return telemetry.SystemRedis }

// close has nothing left: the router closed the publisher and the
// subscribers (each releases its clients, and the embedded server with
// the last of them).
func (b *redisBackend) close() error { return nil }

// redisSubscriber forgets the subscriber in the backend when closed.
type redisSubscriber struct {
	*redisbroker.Subscriber
	forget func()
	once   sync.Once
}

func (s *redisSubscriber) Close() error {
	s.once.Do(s.forget)
	return s.Subscriber.Close()
}

// DeadLettered returns how many malformed Redis entries were moved to
// redis.dead_letter_topic (0 on other brokers).
func (r *Router) DeadLettered() uint64 {
	if b, ok := r.back.(*redisBackend); ok {
		return b.dl.Count()
	}
	return 0
}
