package router

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/telemetry"
)

// redisGroupConfig is the section as a redisbroker configuration for the
// consumer group group: each handler has its own (see redisGroup); the
// publisher ignores it.
func redisGroupConfig(r redisbroker.Config, group string) redisbroker.Config {
	r.ConsumerGroup = group
	r.MaxLen = maps.Clone(r.MaxLen)
	return r
}

// defaultRedisLaneWindow is redis.window when a budget lane selects by
// charge: light and heavy messages then share a stream, and each
// consumer hands over this many messages at once, so that light ones
// reach their lane while heavy ones wait for budget.
const defaultRedisLaneWindow = 16

// redisLaneWindow is redis.window's default for lanes: 16 when a lane
// selects by max_charge, 0 (redisbroker's default, 1) otherwise. Lanes by
// handler or topic split streams, which consumers of their own serve.
func redisLaneWindow(lanes []middleware.Lane) int {
	for _, l := range lanes {
		if l.MaxCharge > 0 {
			return defaultRedisLaneWindow
		}
	}
	return 0
}

// redisGroup is the Redis consumer group of the handler named handler:
// redis.consumer_group is the prefix of every handler's group.
func redisGroup(r redisbroker.Config, handler string) string { return r.ConsumerGroup + "." + handler }

// WithRedis passes options to the router's Redis publisher and
// subscribers (package redisbroker). redisbroker.WithClient sends every
// command through a client of yours instead of dialling redis.addr: a
// Cluster or Sentinel (failover) client, or a pool the program already
// has. The connection fields of the redis section (addr, username,
// password, db, tls) are then ignored and redis.addr need not be set; the
// router never closes the client, so close it after the router. Its pool
// must hold the blocking reads of every handler: redis.consumers per
// handler, plus a few. The router itself adds
// redisbroker.WithoutNackCount unless retry.disabled. Other brokers ignore
// them. Several WithRedis options add up.
func WithRedis(opts ...redisbroker.Option) Option {
	opts = slices.Clone(opts)
	return func(o *options) { o.redis = append(o.redis, opts...) }
}

// validate checks WithBroker against cfg, then runs Config.Validate,
// without the redis section's connection fields when WithRedis gave
// options: one of them may be a client, which makes those fields unused.
// Without a client, redisbroker rejects them as New opens the publisher
// (newRedisBackend).
func (o options) validate(cfg Config) error {
	if errs := o.validateCustom(cfg); len(errs) > 0 {
		return errors.Join(errs...)
	}
	err := cfg.Validate()
	if err == nil || len(o.redis) == 0 || cfg.Broker != brokerRedis {
		return err
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return err
	}
	var keep []error
	for _, e := range joined.Unwrap() {
		var ce *spillway.FieldError
		if errors.As(e, &ce) && (ce.Field == "redis.addr" || strings.HasPrefix(ce.Field, "redis.tls.")) {
			continue
		}
		keep = append(keep, e)
	}
	return errors.Join(keep...)
}

// redisBackend runs each handler as its own redisbroker.Subscriber, in
// its own consumer group, with its own clients; one redisbroker publisher
// serves the router. Entries that cannot be unmarshalled are moved to
// redis.dead_letter_topic by the dead-letter layer of the stack.
type redisBackend struct {
	cfg    redisbroker.Config
	logger watermill.LoggerAdapter
	opts   []redisbroker.Option // WithRedis's, and WithoutNackCount when retrying
	pub    message.Publisher
	dl     *redisbroker.DeadLetter
	dlPub  *latePublisher // dl's publisher: the router's copies publisher once built

	mu   sync.Mutex
	subs map[string]*redisbroker.Subscriber // by handler name

	// running is set when Run starts: from then on the handlers subscribe,
	// creating their groups, and lag reads only the streams subscribed.
	running atomic.Bool
}

// With the retry gate (retrying) the subscribers leave nacks out of the
// delivery count: the gate dead-letters failures itself, and with defer:
// nack it nacks messages it has not run. Without it each nack counts, so
// redis.max_deliveries ends an entry whose handler keeps failing.
//
// given are WithRedis's options. Without a client among them, the
// publisher rejects the connection fields that options.validate let
// through; they are then reported as the redis section's fields.
func newRedisBackend(cfg redisbroker.Config, logger watermill.LoggerAdapter, given []redisbroker.Option, retrying bool) (*redisBackend, error) {
	opts := append([]redisbroker.Option{redisbroker.WithLogger(logger)}, given...)
	if retrying {
		opts = append(opts, redisbroker.WithoutNackCount())
	}
	pub, err := redisbroker.NewPublisher(redisGroupConfig(cfg, ""), opts...)
	if err != nil {
		if errs := validateRedis(cfg); errors.Is(err, spillway.ErrInvalidConfig) && len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		return nil, fmt.Errorf("router: redis: publisher: %w", err)
	}
	if err := pingRedis(cfg, opts); err != nil {
		_ = pub.Close() // leaves a client of WithRedis open
		return nil, err
	}
	dlPub := &latePublisher{}
	dlPub.set(pub)
	dl, err := redisbroker.NewDeadLetter(cfg, redisbroker.WithPublisher(dlPub), redisbroker.WithLogger(logger))
	if err != nil {
		_ = pub.Close()
		return nil, err
	}
	return &redisBackend{cfg: cfg, logger: logger, opts: opts, pub: pub, dl: dl, dlPub: dlPub, subs: make(map[string]*redisbroker.Subscriber)}, nil
}

// pingTimeout bounds the PING with which New checks that Redis answers:
// go-redis's dial timeout, which the redis section does not change.
const pingTimeout = 5 * time.Second

// pingRedis checks that Redis answers, so that New fails at once, naming
// redis.addr, instead of Run failing later. A refused connection fails in
// under a second; a host that does not answer at all, after pingTimeout.
// Called once the publisher holds its client, so that an embedded server
// is not started twice. Without redis.addr, the client is one given with
// WithRedis.
func pingRedis(cfg redisbroker.Config, opts []redisbroker.Option) error {
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	err := redisbroker.Ping(ctx, redisGroupConfig(cfg, ""), opts...)
	switch {
	case err == nil:
		return nil
	case cfg.Addr == "":
		return fmt.Errorf("router: redis: the client given with WithRedis: %w", err)
	default:
		return fmt.Errorf("router: redis.addr %q: %w", cfg.Addr, err)
	}
}

// redisRedelivery is the retry gate's sign of a Redis redelivery: the entry's
// delivery count is above one (it was claimed from another consumer, or
// by this one after it died or stalled).
func redisRedelivery(msg *message.Message) bool { return redisbroker.Deliveries(msg) > 1 }

func (b *redisBackend) publisher() message.Publisher { return b.pub }

func (b *redisBackend) subscriber(handler, _ string) (message.Subscriber, deliveryTracker, error) {
	sub, err := redisbroker.NewSubscriber(redisGroupConfig(b.cfg, b.group(handler)), b.opts...)
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
	}}, redisTracker{sub}, nil
}

// redisTracker is a Redis handler's delivery tracker: a message waiting
// for budget steps aside when the keep-alive loses its entry (a peer
// claimed it, MaxInFlight, refreshes failing, the group recreated), and
// the ack of a revoked entry reaches Redis only for a completed handler
// and only while this consumer still owns it. A nacked message starts a
// new attempt inside the subscriber, so Begin has nothing to do.
type redisTracker struct{ sub *redisbroker.Subscriber }

func (t redisTracker) Revoked(msg *message.Message) <-chan struct{} { return t.sub.Revoked(msg) }
func (redisTracker) Begin(*message.Message)                         {}
func (t redisTracker) Completed(msg *message.Message)               { t.sub.Completed(msg) }
func (redisTracker) Redelivered(msg *message.Message) bool          { return redisRedelivery(msg) }

func (b *redisBackend) group(handler string) string { return redisGroup(b.cfg, handler) }

// Streams are created with their group when a handler subscribes, and by
// the first XADD otherwise.
func (b *redisBackend) ensureTopic(string) error { return nil }

// lag is each handler group's backlog per stream: entries not yet
// delivered plus entries pending (delivered, not acked). Before Run it
// reads each handler's stream, whose group another process may own (and
// fails when the group does not exist); once Run has started, only the
// streams subscribed, so that a group being created is not reported
// missing.
func (b *redisBackend) lag(ctx context.Context, groups []groupTopic) ([]telemetry.LagSample, error) {
	var out []telemetry.LagSample
	for _, g := range groups {
		b.mu.Lock()
		sub := b.subs[g.handler]
		b.mu.Unlock()
		if sub == nil {
			continue
		}
		topics := sub.Topics()
		if len(topics) == 0 && !b.running.Load() {
			topics = []string{g.topic}
		}
		// The router's one telemetry.LagSampler calls this; the
		// subscriber samples nothing by itself.
		for _, t := range topics {
			n, err := sub.Lag(ctx, t)
			if err != nil {
				return nil, fmt.Errorf("router: redis: lag of %s: %w", g.handler, err)
			}
			out = append(out, telemetry.LagSample{Topic: t, Group: sub.Config().ConsumerGroup, Partition: -1, Lag: n})
		}
	}
	return out, nil
}

func (b *redisBackend) deadLetter(moved func(*message.Message, bool)) message.HandlerMiddleware {
	if moved == nil {
		return b.dl.Middleware
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			// The middleware either moves msg or passes it to h: a
			// message that returns without reaching h, and without an
			// error, was moved.
			reached := false
			out, err := b.dl.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				reached = true
				return h(msg)
			})(msg)
			if !reached && err == nil {
				moved(msg, redisbroker.IsMalformed(msg))
			}
			return out, err
		}
	}
}

func (b *redisBackend) system() string { return "redis" }

// close has nothing left: the router closed the publisher and the
// subscribers, and waited for them (waitClosed; each releases its clients,
// and the embedded server with the last of them; a client given with
// WithRedis stays open).
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

// waitClosed returns once the subscriber's Close has finished: a second
// Close waits for the first, which Watermill's router started.
func (s *redisSubscriber) waitClosed() { _ = s.Subscriber.Close() }

// brokers is nil: Redis has no bootstrap list.

// redelivered reports whether Redis delivered msg's entry before.
func (b *redisBackend) redelivered(msg *message.Message, _ deliveryTracker) bool {
	return redisRedelivery(msg)
}

// useCopies makes dead letters of unreadable entries copies too: traced,
// and not counted.
func (b *redisBackend) useCopies(p message.Publisher) { b.dlPub.set(p) }

// addStats counts the malformed entries moved to redis.dead_letter_topic.
func (b *redisBackend) addStats(s *Stats) { s.DeadLettered += b.dl.Count() }

// keepAlive sums the keep-alive counters of the open subscribers; those
// of subscribers already closed are not included.
func (b *redisBackend) keepAlive() (redisbroker.SubscriberStats, bool) {
	var sum redisbroker.SubscriberStats
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.subs {
		st := s.Stats()
		sum.Tracked += st.Tracked
		sum.Refreshed += st.Refreshed
		sum.Lost += st.Lost
		sum.Expired += st.Expired
		sum.Revoked += st.Revoked
		sum.RefreshErrors += st.RefreshErrors
	}
	return sum, true
}

// keyWindows has nothing to report: key windows are Kafka's.
func (b *redisBackend) keyWindows(func(string, *kafkabroker.SessionTracker)) {}

// started makes lag read only the streams subscribed from now on.
func (b *redisBackend) started() { b.running.Store(true) }

// owned is every sample: each consumer of a group reads its whole stream.
func (b *redisBackend) owned(s []telemetry.LagSample) []telemetry.LagSample { return s }
