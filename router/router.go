package router

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/producer"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/shedding"
	"github.com/spillway-go/spillway/sizing"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/telemetry/kafkatel"
)

// Option customises a [Router] beyond its Config: things that are code,
// not configuration.
type Option func(*options)

type options struct {
	hooks       []any // WithHooks
	estimator   cost.ChargeEstimator
	isPermanent func(error) bool
	signals     []os.Signal
	telemetry   []telemetry.Option   // WithTelemetry
	kafka       []kafkabroker.Option // WithKafka
	redis       []redisbroker.Option // WithRedis
	custom      *CustomBroker        // WithBroker
	wm          *message.Router      // WithWatermillRouter
}

// WithWatermillRouter builds the router on wm, a Watermill router of your
// own (with its plugins, decorators and configuration), instead of a new
// one. [New] adds Spillway's whole stack to wm as router-level
// middlewares, in its fixed order (docs/router.md), so the order cannot be
// wrong; the Router owns wm from then on:
//
//   - Add handlers with [Router.AddHandler] and [Router.AddConsumerHandler],
//     never with wm's own methods: the router subscribes each one's retry
//     topic and tracks its deliveries. Run refuses a handler added to wm
//     directly, since the retry gate would defer its failures to a topic
//     nothing consumes.
//   - Middlewares added to wm before New run outside Spillway's stack (they
//     see each delivery once, before tracing); those added after run
//     inside it, with the message's vertices held, as handler-level ones
//     do. Keep retries out of both: the retry gate retries outside the
//     budget.
//   - Run and Close wm through the Router, which drains admitted work
//     before wm stops. wm must not be running.
//
// wm's CloseTimeout stays wm's; close_timeout bounds the drain.
func WithWatermillRouter(wm *message.Router) Option {
	return func(o *options) { o.wm = wm }
}

// WithSignals makes [Router.Run] shut the router down gracefully, as Close
// does, when the process receives one of sigs (SIGINT and SIGTERM when none
// are given). Without it the router leaves signals alone: they belong to the
// program, which may cancel Run's context or call Close on its own terms.
func WithSignals(sigs ...os.Signal) Option {
	if len(sigs) == 0 {
		sigs = []os.Signal{os.Interrupt, syscall.SIGTERM}
	}
	sigs = slices.Clone(sigs)
	return func(o *options) { o.signals = sigs }
}

// WithEstimator replaces the estimator built from Config.Budget.
func WithEstimator(e cost.ChargeEstimator) Option {
	return func(o *options) { o.estimator = e }
}

// WithIsPermanent replaces the retry gate's classifier of permanent errors
// (default [retrygate.IsPermanent]: errors marked with retrygate.Permanent
// and undecodable geometry). A permanent error dead-letters the message at
// once.
func WithIsPermanent(f func(error) bool) Option {
	return func(o *options) { o.isPermanent = f }
}

// WithTelemetry passes options to the router's telemetry (its spans,
// metrics and the series of its inner layers): typically
// telemetry.WithTracerProvider, telemetry.WithMeterProvider and
// telemetry.WithPropagator, each of which defaults to OpenTelemetry's
// global, which exports nothing until the application installs one. Pass
// propagation.TraceContext{} to telemetry.WithPropagator for W3C
// traceparent. With a custom broker, telemetry.WithMessagingSystem names
// the messaging.system of spans (default watermill). Leave
// telemetry.WithLinkToProducer and telemetry.WithAttributes out: the
// router sets them after these options (telemetry.link_producer; Kafka's
// partition, offset and key and each handler's consumer group). Ignored
// with telemetry.disabled. Several WithTelemetry options add up, later
// ones winning.
func WithTelemetry(opts ...telemetry.Option) Option {
	opts = slices.Clone(opts)
	return func(o *options) { o.telemetry = append(o.telemetry, opts...) }
}

// WithKafka passes options to the router's Kafka cluster, the
// [kafkabroker.Cluster] behind its publisher and every subscriber:
// kafkabroker.WithSaramaConfig adjusts every Sarama configuration the
// router builds (the kafka section's escape hatch), kafkabroker.WithTracer
// composes a watermill-kafka tracer (for example
// kafka.NewOTELSaramaTracer()) with the router's session tracking. Other
// brokers ignore them. Several WithKafka options add up.
func WithKafka(opts ...kafkabroker.Option) Option {
	opts = slices.Clone(opts)
	return func(o *options) { o.kafka = append(o.kafka, opts...) }
}

// Router is a Watermill router with the Spillway middleware stack in front
// of every handler and a publisher and subscribers for the configured
// broker. Handler code is the same for every broker. Create it with [New],
// add handlers, then [Router.Run]; stop it with [Router.Close], by ending
// Run's context, or (with [WithSignals]) by a signal.
type Router struct {
	cfg    Config
	logger watermill.LoggerAdapter
	opts   options

	wm       *message.Router
	back     backend
	pub      message.Publisher // stamping, over back.publisher() (router/publish.go)
	copies   message.Publisher // retry, dead-letter and audit copies: never re-stamped
	outputs  message.Publisher // handler outputs: spillway_* stripped, stamped where countable
	budget   *middleware.VertexBudget
	budgetMW *middleware.Admitter
	policy   *shedding.Policy  // nil: no sheddable topics
	retry    *retrygate.Gate   // nil: retry.disabled
	sizer    *sizing.AutoSizer // nil: budget.autosize.enabled is false

	tracing    message.HandlerMiddleware // nil: telemetry.disabled
	metrics    *telemetry.Metrics        // nil: telemetry.disabled
	lagSampler *telemetry.LagSampler     // nil: telemetry.disabled, or memory
	backlog    backlogCache              // the lag sampler's latest backlog estimate
	drained    rateMeter                 // vertices admitted, for the drain rate
	unregister []func() error            // metric callbacks, undone by Close
	deadLetter message.HandlerMiddleware

	// producerPub is what Publisher returns: pub, or pub behind the
	// producer section's rate limit and lag throttle (router/producer.go).
	producerPub  message.Publisher
	rateLimited  *producer.RateLimited  // nil: producer.rate_limit off
	lagThrottled *producer.LagThrottled // nil: producer.lag_throttle off

	mu       sync.Mutex
	trackers atomic.Pointer[map[string]deliveryTracker] // by handler name; written under mu
	topics   map[string]string                          // handler name -> subscribed topic
	retryHs  map[string]*message.Handler
	subs     []message.Subscriber
	runCtx   context.Context
	ran      bool

	closingCtx    context.Context
	closingCancel context.CancelFunc
	closeOnce     sync.Once
	closeErr      error
	closed        chan struct{}

	settling settling // messages not yet acked or nacked

	revocations, cancellations atomic.Uint64 // admissions that ended so (Stats)
	defaulted, computed        atomic.Uint64 // admitted charges without a usable vertex_count (Stats)

	unstampedLog topicNotices // the first default charge of each topic (router/warnings.go)
	oversizeLog  topicNotices // oversize refusals, per topic and oversizeLogEvery
}

// New builds a router for cfg: the broker's publisher and subscriber
// factory, the vertex budget, the telemetry and the middleware stack. cfg
// gets its defaults and is validated first. A nil logger logs nothing; a repeated error
// line is logged 10 times at once, then once every 10 s with a
// "suppressed" field counting those left out. For
// kafka with brokers [embedded] it starts an in-process broker that Close
// stops; redis with addr embedded runs an in-process miniredis.
func New(cfg Config, logger watermill.LoggerAdapter, opts ...Option) (*Router, error) {
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return newRouter(cfg, logger, o)
}

// newRouter is New after the options are applied: it checks cfg, opens
// the backend, then builds the layers over it (build).
func newRouter(cfg Config, logger watermill.LoggerAdapter, o options) (*Router, error) {
	if cfg.Broker == "" && o.custom != nil {
		cfg.Broker = brokerCustom
	}
	cfg.custom = o.custom
	cfg.setDefaults()
	if err := o.validate(cfg); err != nil {
		return nil, err
	}
	if _, err := newHookSet(o.hooks); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	} else {
		logger = newLimitedLogger(logger)
	}
	r := &Router{
		cfg:     cfg,
		logger:  logger,
		opts:    o,
		topics:  make(map[string]string),
		retryHs: make(map[string]*message.Handler),
		closed:  make(chan struct{}),
	}
	r.closingCtx, r.closingCancel = context.WithCancel(context.Background())
	if err := r.openBackend(); err != nil {
		return nil, err
	}
	if err := r.build(); err != nil {
		// Close what the backend opened, and the metrics registered.
		r.unregisterMetrics()
		_ = r.back.publisher().Close()
		_ = r.back.close()
		return nil, err
	}
	return r, nil
}

// build runs the construction steps after openBackend, in order; on an
// error the caller closes the backend.
func (r *Router) build() error {
	topts, tracingOpts, err := r.buildTelemetry()
	if err != nil {
		return err
	}
	hs, err := r.buildHooks()
	if err != nil {
		return err
	}
	r.buildPublishers(topts)
	r.buildDeadLetter()
	est, err := r.buildBudget()
	if err != nil {
		return err
	}
	if err := r.buildShedding(hs); err != nil {
		return err
	}
	if err := r.buildAdmission(hs, est); err != nil {
		return err
	}
	if err := r.buildRetryGate(hs); err != nil {
		return err
	}
	if err := r.buildAutoSizer(hs); err != nil {
		return err
	}
	if err := r.observe(); err != nil {
		return err
	}
	if err := r.buildProducer(topts); err != nil {
		return err
	}
	return r.buildWatermillRouter(tracingOpts)
}

// openBackend opens the broker that cfg.broker names.
func (r *Router) openBackend() error {
	var err error
	switch r.cfg.Broker {
	case brokerMemory:
		r.back = newMemoryBackend(r.logger)
	case brokerKafka:
		r.back, err = newKafkaBackend(r.cfg.Kafka, r.logger, r.opts)
	case brokerRedis:
		r.back, err = newRedisBackend(r.cfg.Redis, r.logger, r.opts.redis, !r.cfg.Retry.Disabled)
	case brokerCustom:
		r.back = &customBackend{b: *r.opts.custom}
	default:
		// Validate rejects any other broker name before this point.
		return fmt.Errorf("router: unknown broker %q", r.cfg.Broker)
	}
	return err
}

// buildTelemetry builds the router's metrics and returns the telemetry
// options of the publishers and of the consumer spans; both nil when
// telemetry is disabled. Tracing is outermost, then metrics; the producer
// chain is tracing over stamping over the broker.
func (r *Router) buildTelemetry() (topts, tracingOpts []telemetry.Option, err error) {
	if r.cfg.Telemetry.Disabled {
		return nil, nil, nil
	}
	// WithTelemetry's options come after the broker's messaging system,
	// which they may rename, and before the router's own settings.
	topts = append([]telemetry.Option{telemetry.WithMessagingSystem(r.back.system())}, r.opts.telemetry...)
	topts = append(topts, telemetry.WithLinkToProducer(r.cfg.Telemetry.LinkProducer))
	var brokerAttrs func(*message.Message) []attribute.KeyValue
	if r.cfg.Broker == brokerKafka {
		brokerAttrs = kafkatel.Attributes
		topts = append(topts, telemetry.WithAttributes(brokerAttrs))
	}
	// The consumer spans carry the handler's consumer group too.
	tracingOpts = append(slices.Clip(topts), telemetry.WithAttributes(r.consumerAttributes(brokerAttrs)))
	if r.metrics, err = telemetry.NewMetrics(topts...); err != nil {
		return nil, nil, fmt.Errorf("router: telemetry: %w", err)
	}
	return topts, tracingOpts, nil
}

// buildHooks returns the hooks the router calls: its metrics first, so
// that they see every event before the hooks of WithHooks.
func (r *Router) buildHooks() (hookSet, error) {
	hooks := r.opts.hooks
	if r.metrics != nil {
		hooks = append([]any{r.metrics}, hooks...)
	}
	return newHookSet(hooks)
}

// buildDeadLetter takes the broker's dead-letter layer, counted in the
// metrics when there are any.
func (r *Router) buildDeadLetter() {
	var moved func(*message.Message, bool)
	if r.metrics != nil {
		moved = r.recordDeadLettered
	}
	r.deadLetter = r.back.deadLetter(moved)
}

// buildBudget builds the vertex budget and returns the cost estimator
// (WithEstimator's, or one from budget.default_cost).
func (r *Router) buildBudget() (cost.ChargeEstimator, error) {
	cfg := r.cfg.Budget
	var bopts []middleware.Option
	if cfg.MessageLimit > 0 {
		bopts = append(bopts, middleware.WithMessageLimit(cfg.MessageLimit))
	}
	if len(cfg.Lanes) > 0 {
		bopts = append(bopts, middleware.WithLanes(cfg.Lanes...))
	}
	var err error
	if r.budget, err = middleware.NewVertexBudget(cfg.Vertices, bopts...); err != nil {
		return nil, fmt.Errorf("router: budget: %w", err)
	}
	if est := r.opts.estimator; est != nil {
		return est, nil
	}
	var eopts []cost.Option
	if cfg.ComputeMissing {
		eopts = append(eopts, cost.WithComputeMissing())
	}
	return cost.NewEstimator(cfg.DefaultCost, eopts...), nil
}

// buildShedding builds the priority shedding policy when shedding.topics
// names any, and makes its audit topic exist.
func (r *Router) buildShedding(hs hookSet) error {
	cfg := r.cfg
	if len(cfg.Shedding.Topics) == 0 {
		return nil
	}
	sopts := []shedding.Option{shedding.WithPressure(r.sheddingPressure(cfg.Shedding.Pressure)),
		shedding.WithAuditPublisher(nopClosePublisher{r.copies}), shedding.WithOnShed(hs.onShed),
		shedding.WithRedelivery(r.redelivered)}
	if !cfg.Retry.Disabled {
		sopts = append(sopts, shedding.WithTopicFunc(r.originTopic))
	}
	var err error
	if r.policy, err = shedding.New(cfg.Shedding.Config, sopts...); err != nil {
		return err
	}
	if t := cfg.Shedding.AuditTopic; t != "" {
		return r.back.ensureTopic(t)
	}
	return nil
}

// revocable reports whether waiters step aside when their delivery is
// lost: on Kafka (session ended) and Redis (entry lost).
func (r *Router) revocable() bool {
	return (r.cfg.Broker == brokerKafka || r.cfg.Broker == brokerRedis)
}

// buildAdmission builds the budget's admission middleware.
func (r *Router) buildAdmission(hs hookSet, est cost.ChargeEstimator) error {
	opts := append([]middleware.Option{middleware.WithEstimator(est), middleware.WithOnAdmission(r.countAdmission(hs.admission))},
		r.limitSize()...)
	var revoked func(*message.Message) <-chan struct{}
	if r.revocable() {
		revoked = r.revoked
	}
	if r.policy != nil && (revoked != nil || r.cfg.Shedding.Coalesce.Enabled) {
		// A waiter steps aside when a newer message of its entity
		// supersedes it, when its Kafka session ends, or when its
		// Redis entry is lost.
		revoked = r.policy.Revoked(revoked)
	}
	if revoked != nil {
		opts = append(opts, middleware.WithRevoked(revoked))
	}
	var err error
	r.budgetMW, err = middleware.New(r.budget, opts...)
	return err
}

// buildRetryGate builds the retry gate unless retry.disabled.
func (r *Router) buildRetryGate(hs hookSet) error {
	if r.cfg.Retry.Disabled {
		return nil
	}
	// A message waiting in the gate steps aside when its Kafka session
	// ends or its Redis entry is lost, as a budget waiter does.
	var retryRevoked func(*message.Message) <-chan struct{}
	if r.revocable() {
		retryRevoked = r.revoked
	}
	var err error
	r.retry, err = retrygate.New(nopClosePublisher{r.copies}, r.cfg.Retry.Config,
		retrygate.WithPressure(budgetPressure{r}),
		retrygate.WithIsPermanent(r.opts.isPermanent),
		retrygate.WithRedelivery(r.isRedelivery),
		retrygate.WithRevoked(retryRevoked),
		retrygate.WithOnOutcome(hs.onRetryOutcome),
		retrygate.WithLogger(r.logger))
	return err
}

// buildAutoSizer builds the budget's auto-sizer when budget.autosize is
// enabled.
func (r *Router) buildAutoSizer(hs hookSet) error {
	a := r.cfg.Budget.AutoSize
	if !a.Enabled {
		return nil
	}
	sc := a.Config
	sc.Deadline = r.cfg.autoSizeDeadline()
	sc.MemoryBound = a.memoryBound()
	var err error
	if r.sizer, err = sizing.New(r.budget, sc, sizing.WithOnResize(hs.onResize)); err != nil {
		return fmt.Errorf("router: budget.autosize: %w", err)
	}
	return nil
}

// buildWatermillRouter takes WithWatermillRouter's router, or builds one,
// and adds the middleware stack to it.
func (r *Router) buildWatermillRouter(tracingOpts []telemetry.Option) error {
	switch wm := r.opts.wm; {
	case wm == nil:
		var err error
		if r.wm, err = message.NewRouter(message.RouterConfig{CloseTimeout: r.cfg.CloseTimeout}, r.logger); err != nil {
			return err
		}
	case wm.IsRunning() || wm.IsClosed():
		return errors.New("router: WithWatermillRouter: the Watermill router is running or closed; give it to New before Run")
	default:
		r.wm = wm
	}
	if tracingOpts != nil {
		r.tracing = telemetry.NewTracing(tracingOpts...)
	}
	r.wm.AddMiddleware(r.stack().middlewares()...)
	return nil
}

// Publisher returns the broker's publisher, wrapped so that every message
// published through it is stamped with its vertex_count, and slowed down
// by the producer section's rate limit and lag throttle when they are set.
// It stays open until the router is closed; do not close it yourself.
func (r *Router) Publisher() message.Publisher { return nopClosePublisher{r.producerPub} }

// tracker returns the delivery tracker of the handler named handler, nil
// if it has none. It takes no lock: it is on every message's path.
func (r *Router) tracker(handler string) deliveryTracker {
	if m := r.trackers.Load(); m != nil {
		return (*m)[handler]
	}
	return nil
}

// setTracker sets (tr non-nil) or removes the tracker of the handler named
// handler, copy on write. r.mu must be held.
func (r *Router) setTracker(handler string, tr deliveryTracker) {
	next := make(map[string]deliveryTracker)
	if m := r.trackers.Load(); m != nil {
		maps.Copy(next, *m)
	}
	if tr == nil {
		delete(next, handler)
	} else {
		next[handler] = tr
	}
	r.trackers.Store(&next)
}

// revoked is the budget's Revoked hook: the channel closed when msg's
// delivery is lost (its Kafka session ended, its Redis entry claimed by a
// peer), from its delivery tracker; nil when it has none.
func (r *Router) revoked(msg *message.Message) <-chan struct{} {
	if d, ok := msg.Context().(*delivery); ok {
		// Under admission: the gate asked the tracker already.
		return d.revoked
	}
	if t := r.deliveryTrackerOf(msg); t != nil {
		return t.Revoked(msg)
	}
	return nil
}

// deliveryTrackerOf returns the delivery tracker of msg's delivery, found
// below its context, or of its handler.
func (r *Router) deliveryTrackerOf(msg *message.Message) deliveryTracker {
	if d := deliveryFrom(msg.Context()); d != nil {
		return d.tracker
	}
	return r.tracker(message.HandlerNameFromCtx(msg.Context()))
}

// RetryHandler returns the Watermill handler, named "<name>.retry", that
// consumes the retry topic of the handler named name, or nil (no such
// handler, or the retry gate is off). It runs the same handler function behind the same stack; add any
// handler-level middleware that the handler has to it too.
func (r *Router) RetryHandler(name string) *message.Handler {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.retryHs[name]
}

// retryHandlerName is the name of the handler that consumes the retry
// topic of the handler named name; on Kafka its consumer group is
// "<kafka.consumer_group>.<name>.retry".
func retryHandlerName(name string) string { return name + ".retry" }

// AddHandler adds a handler named name that consumes subscribeTopic and
// publishes what it returns to publishTopic: every spillway_* metadata key
// of an output is removed (they are the retry gate's and shedding's
// bookkeeping, and must not travel from input to output), and each output
// is stamped with its vertex_count, or published without one when its
// payload cannot be counted (never refused: that would nack the input
// forever). On Kafka the topic is created if missing (embedded broker, or
// kafka.create_topics) and the handler consumes in its own consumer group,
// "<kafka.consumer_group>.<name>". It may be called before or after Run.
//
// Unless retry.disabled, a second handler, "<name>.retry", runs h
// on the retry topic of subscribeTopic with the same stack (see
// [Router.RetryHandler]), and on Kafka the retry and dead-letter topics
// are created too.
func (r *Router) AddHandler(name, subscribeTopic, publishTopic string, h message.HandlerFunc) (*message.Handler, error) {
	if publishTopic == "" {
		return nil, fmt.Errorf("router: handler %q: empty publish topic (use AddConsumerHandler)", name)
	}
	if err := r.back.ensureTopic(publishTopic); err != nil {
		return nil, err
	}
	return r.add(name, subscribeTopic, func(name, topic string, sub message.Subscriber) *message.Handler {
		return r.wm.AddHandler(name, topic, sub, publishTopic, nopClosePublisher{r.outputs}, h)
	})
}

// AddConsumerHandler adds a handler that publishes nothing (it may still
// use [Router.Publisher] directly). See AddHandler.
func (r *Router) AddConsumerHandler(name, topic string, h message.NoPublishHandlerFunc) (*message.Handler, error) {
	return r.add(name, topic, func(name, topic string, sub message.Subscriber) *message.Handler {
		return r.wm.AddConsumerHandler(name, topic, sub, h)
	})
}

// add subscribes the handler name to topic and, with the retry gate on,
// its retry handler to the retry topic; both or neither.
func (r *Router) add(name, topic string, addTo func(name, topic string, sub message.Subscriber) *message.Handler) (*message.Handler, error) {
	sub, err := r.subscriber(name, topic)
	if err != nil {
		return nil, err
	}
	var (
		retryName, retryTopic string
		retrySub              message.Subscriber
	)
	if r.retry != nil {
		retryName, retryTopic = retryHandlerName(name), r.cfg.Retry.RetryTopicFor(topic)
		err := r.back.ensureTopic(r.cfg.Retry.DeadLetterTopicFor(topic))
		if err == nil {
			retrySub, err = r.subscriber(retryName, retryTopic)
		}
		if err != nil {
			r.unsubscribe(name, sub)
			return nil, err
		}
	}
	mh := addTo(name, topic, sub)
	if retrySub != nil {
		rh := addTo(retryName, retryTopic, retrySub)
		r.mu.Lock()
		r.retryHs[name] = rh
		r.mu.Unlock()
	}
	return mh, r.startIfRunning()
}

// unsubscribe undoes subscriber for a handler that could not be added.
func (r *Router) unsubscribe(name string, sub message.Subscriber) {
	r.mu.Lock()
	delete(r.topics, name)
	r.setTracker(name, nil)
	if i := slices.Index(r.subs, sub); i >= 0 {
		r.subs = slices.Delete(r.subs, i, i+1)
	}
	r.mu.Unlock()
	_ = sub.Close()
}

// originTopic is the topic the shedding policy files msg under: the topic
// it was consumed from, except that a retry copy consumed from a retry
// topic counts as its origin topic's, so a retried message of a sheddable
// stream stays sheddable and its entity's versions are guarded together.
func (r *Router) originTopic(msg *message.Message) string {
	topic := message.SubscribeTopicFromCtx(msg.Context())
	if origin := msg.Metadata.Get(retrygate.OriginTopicKey); origin != "" && origin != topic &&
		r.cfg.Retry.RetryTopicFor(origin) == topic {
		return origin
	}
	return topic
}

// redelivered reports, for coalescing, whether msg was delivered before:
// a retry copy consumed from a retry topic, or a broker redelivery
// ([Router.isRedelivery]). Such a message never supersedes a message of its
// entity in flight.
func (r *Router) redelivered(msg *message.Message) bool {
	if r.originTopic(msg) != message.SubscribeTopicFromCtx(msg.Context()) {
		return true
	}
	return r.isRedelivery(msg)
}

func (r *Router) subscriber(name, topic string) (message.Subscriber, error) {
	if name == "" || topic == "" {
		return nil, fmt.Errorf("router: handler name and topic must not be empty (name %q, topic %q)", name, topic)
	}
	if r.closingCtx.Err() != nil {
		return nil, errors.New("router: closed")
	}
	r.mu.Lock()
	if _, dup := r.topics[name]; dup {
		r.mu.Unlock()
		return nil, fmt.Errorf("router: duplicate handler name %q", name)
	}
	r.topics[name] = topic // reserve the name
	r.mu.Unlock()
	sub, tr, err := r.newSubscriber(name, topic)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		delete(r.topics, name)
		return nil, err
	}
	if tr != nil {
		r.setTracker(name, tr)
	}
	r.subs = append(r.subs, sub)
	return sub, nil
}

func (r *Router) newSubscriber(name, topic string) (message.Subscriber, deliveryTracker, error) {
	if err := r.back.ensureTopic(topic); err != nil {
		return nil, nil, err
	}
	return r.back.subscriber(name, topic)
}

func (r *Router) startIfRunning() error {
	r.mu.Lock()
	ctx, ran := r.runCtx, r.ran
	r.mu.Unlock()
	if !ran || ctx == nil {
		return nil
	}
	<-r.wm.Running()
	return r.wm.RunHandlers(ctx)
}

// Run starts every handler and blocks until the router is closed: by Close,
// by ctx ending, or by a signal named with [WithSignals], each of which
// shuts down gracefully (see Close). It returns nil after a graceful
// shutdown.
//
// First it checks budget.lanes against the handlers added so far: a lane
// that selects a handler or topic that none of them has matches nothing,
// so Run closes the router and returns one [*spillway.FieldError] per such
// name (field budget.lanes[i].handlers or .topics), listing the handlers or
// topics that exist. Add the handlers a lane names before Run.
func (r *Router) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.ran {
		r.mu.Unlock()
		return errors.New("router: already running")
	}
	if r.closingCtx.Err() != nil {
		r.mu.Unlock()
		return errors.New("router: closed")
	}
	err := checkLaneSelectors(r.cfg, r.topics)
	if direct := r.directHandlers(); len(direct) > 0 {
		err = errors.Join(err, fmt.Errorf("router: handlers %s were added to the Watermill router directly: "+
			"add them with Router.AddHandler or AddConsumerHandler, which consume their retry topics and track their deliveries", strings.Join(direct, ", ")))
	}
	if err != nil {
		r.mu.Unlock()
		if cerr := r.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return err
	}
	r.ran = true
	// Subscribers get a context that outlives ctx: shutdown must go
	// through Close, which drains admitted work before they stop.
	r.runCtx = context.WithoutCancel(ctx)
	r.mu.Unlock()
	if r.cfg.Retry.Disabled {
		r.logger.Info("router: retry gate off (retry.disabled): a message whose handler fails is nacked and redelivered "+
			"without bound (on Redis, up to redis.max_deliveries times), and may hold up the messages behind it; "+
			"only payloads that cannot be decoded are dead-lettered", nil)
	}
	r.back.started()
	if r.lagSampler != nil {
		r.lagSampler.Start() // a no-op once Close has closed it
	}

	sigCtx := ctx
	if len(r.opts.signals) > 0 {
		var stop context.CancelFunc
		sigCtx, stop = signal.NotifyContext(ctx, r.opts.signals...)
		defer stop()
	}

	errc := make(chan error, 1)
	go func() { errc <- r.wm.Run(r.runCtx) }()

	select {
	case err := <-errc:
		// Watermill stopped by itself: every handler's subscription ended,
		// or it failed to start.
		cerr := r.Close()
		if err != nil {
			return err
		}
		return cerr
	case <-sigCtx.Done():
		if ctx.Err() == nil {
			r.logger.Info("Signal received, closing router", nil)
		}
		cerr := r.Close()
		return errors.Join(<-errc, cerr)
	case <-r.closed:
		return <-errc
	}
}

// directHandlers returns, sorted, the handlers of the Watermill router that
// were not added through r (WithWatermillRouter). r.mu must be held.
func (r *Router) directHandlers() []string {
	var out []string
	for name := range r.wm.Handlers() {
		if _, ok := r.topics[name]; !ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Running is closed once the router is running (Watermill's Running).
func (r *Router) Running() chan struct{} { return r.wm.Running() }

// Close shuts the router down gracefully and is idempotent:
//
//  1. Stop taking new messages: nothing new passes the budget's gate, and
//     messages still waiting for budget give up; both are nacked, so the
//     broker redelivers them, never lost and never acked unprocessed.
//  2. Let admitted work finish, for up to close_timeout, so its acks are
//     committed.
//  3. Close Watermill's router (subscribers first, then wait up to
//     close_timeout for handlers), the publisher and, if embedded, the
//     Kafka broker.
func (r *Router) Close() error {
	r.closeOnce.Do(func() {
		r.closeErr = r.close()
		close(r.closed)
	})
	return r.closeErr
}

// closeWaiter is a subscriber whose Close, which Watermill's router calls
// as it closes, may go on after Watermill has stopped waiting for it.
type closeWaiter interface {
	// waitClosed returns once the subscriber's Close has finished.
	waitClosed()
}

func (r *Router) close() error {
	r.closingCancel()
	deadline := time.Now().Add(r.cfg.CloseTimeout)
	var errs []error
	if r.lagSampler != nil {
		_ = r.lagSampler.Close() // before the clients it samples through
	}
	// Finished work is acked (or nacked) by Watermill after the stack
	// returns, and after the messages the handler produced are published:
	// wait for that too, not only for the handlers, or the subscribers
	// below would close first and the broker would redeliver work that is
	// done.
	if n, running := r.settling.wait(deadline); n > 0 {
		if running > 0 {
			errs = append(errs, fmt.Errorf("router: close: %d admitted messages still running after %s", running, r.cfg.CloseTimeout))
		}
		errs = append(errs, fmt.Errorf("router: close: %d messages still unacknowledged after %s", n, r.cfg.CloseTimeout))
	}

	r.mu.Lock()
	ran := r.ran
	subs := r.subs
	r.mu.Unlock()
	if ran {
		if err := r.wm.Close(); err != nil {
			errs = append(errs, fmt.Errorf("router: close: %w", err))
		}
		// Watermill stops waiting for a subscriber once its message
		// channels close; a Redis subscriber still sends its last acks
		// after that. Wait for the rest of its Close.
		for _, s := range subs {
			if w, ok := s.(closeWaiter); ok {
				w.waitClosed()
			}
		}
	} else {
		// Never ran: Watermill would wait for handlers that never started.
		for _, s := range subs {
			if err := s.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := r.pub.Close(); err != nil {
		errs = append(errs, fmt.Errorf("router: close publisher: %w", err))
	}
	if err := r.back.close(); err != nil {
		errs = append(errs, err)
	}
	r.unregisterMetrics()
	return errors.Join(errs...)
}

// Stats is a snapshot of the router's admission state.
type Stats struct {
	// Budget is the vertex budget's figures, all lanes together.
	Budget middleware.BudgetStats
	// Lanes has one entry per budget.lanes entry, in order: its name,
	// its ceiling (the capacity less the other lanes' reservations),
	// vertices in use, waiters and admissions. Nil without lanes.
	Lanes         []middleware.BudgetStats
	Revocations   uint64 // messages waiting for budget or in the retry gate that stepped aside (Kafka rebalance, Redis entry lost, or superseded)
	Cancellations uint64 // waiting messages that gave up (shutdown)
	LateMarks     uint64 // acks committed after their session ended (Kafka)
	Evictions     uint64 // times a member came back under a new member id (Kafka)
	DeadLettered  uint64 // malformed or over-delivered entries moved to redis.dead_letter_topic (Redis)

	// Admitted messages whose vertex_count was missing or malformed:
	// charged budget.default_cost (Defaulted), or counted from their
	// payload with budget.compute_missing (Computed). The other admitted
	// messages were charged their stamped vertex_count.
	Defaulted, Computed uint64

	// DrainRate is the vertices per second this process drains, all
	// handlers together: the auto-sizer's measured throughput when
	// budget.autosize is on, otherwise the vertices the budget admitted
	// per second, measured over the time since the previous reading (at
	// least a second; a reading sooner returns the previous rate). 0 until
	// measured. [Router.Backlog] divided by it is the drain time.
	DrainRate float64

	Shedding *shedding.Stats  // nil when shedding is off
	Retry    *retrygate.Stats // nil when the retry gate is off
	AutoSize *sizing.Bounds   // nil when auto-sizing is off

	// The producer section's layers of [Router.Publisher]: what the rate
	// limit charged, refused and waited, and the lag throttle's waits.
	RateLimit   *producer.Stats // nil unless producer.rate_limit.vertices_per_second is set
	LagThrottle *producer.Stats // nil unless producer.lag_throttle.threshold is set
}

// countAdmission returns the budget's admission hook: it counts the
// revoked and cancelled admissions, and the charges not read from a
// vertex_count header, for [Router.Stats] (logging the first default
// charge of each topic), then calls hooks in turn.
func (r *Router) countAdmission(hooks []admissionHook) func(*message.Message, middleware.Admission) {
	return func(msg *message.Message, a middleware.Admission) {
		switch a.Result {
		case middleware.Admitted:
			r.drained.add(a.Granted)
		case middleware.Revoked:
			r.revocations.Add(1)
		case middleware.Cancelled:
			r.cancellations.Add(1)
		}
		if a.Charge.Source != cost.SourceHeader {
			r.unstamped(msg, &a)
		}
		for _, h := range hooks {
			h.OnAdmission(msg, a)
		}
	}
}

// Stats returns a snapshot.
func (r *Router) Stats() Stats {
	s := Stats{Budget: r.budget.Stats()}
	if len(r.cfg.Budget.Lanes) > 0 {
		s.Lanes = r.budget.Lanes()
	}
	s.Revocations, s.Cancellations = r.revocations.Load(), r.cancellations.Load()
	s.Defaulted, s.Computed = r.defaulted.Load(), r.computed.Load()
	s.DrainRate = r.drainRate()
	if r.policy != nil {
		st := r.policy.Stats()
		s.Shedding = &st
	}
	if r.retry != nil {
		st := r.retry.Stats()
		s.Retry = &st
		s.Revocations += st.Revoked
	}
	if r.sizer != nil {
		b := r.sizer.Bounds()
		s.AutoSize = &b
	}
	if r.rateLimited != nil {
		st := r.rateLimited.Stats()
		s.RateLimit = &st
	}
	if r.lagThrottled != nil {
		st := r.lagThrottled.Stats()
		s.LagThrottle = &st
	}
	r.back.addStats(&s)
	return s
}

// ErrLagUnknown is returned by [Router.Lag] when the broker cannot report
// consumer lag (memory).
var ErrLagUnknown = errors.New("router: consumer lag unknown for this broker")

// Lag reads, now, how many messages the router's handlers (retry handlers
// included) have yet to finish, summed over their topics: on Kafka, per
// partition, the high-water mark minus the group's committed offset (a
// partition never committed counts from its oldest retained offset); on
// Redis, per stream, the entries not yet delivered to the handler's group
// plus those delivered but not acked. The router's lag sampler reads the same
// samples in the background. It may be called before Run, to read the lag
// of groups that other processes consume in: on Redis each handler's
// group, its retry handler's included, must then exist already (a
// subscriber creates it), or Lag fails.
func (r *Router) Lag(ctx context.Context) (int64, error) {
	samples, err := r.lagSamples(ctx)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, s := range samples {
		total += max(s.Lag, 0)
	}
	return total, nil
}

// lagSamples is the router's telemetry.LagSource.
func (r *Router) lagSamples(ctx context.Context) ([]telemetry.LagSample, error) {
	r.mu.Lock()
	groups := make([]groupTopic, 0, len(r.topics))
	for name, topic := range r.topics {
		groups = append(groups, groupTopic{handler: name, topic: topic})
	}
	r.mu.Unlock()
	slices.SortFunc(groups, func(a, b groupTopic) int { return strings.Compare(a.handler, b.handler) })
	return r.back.lag(ctx, groups)
}

type groupTopic struct{ handler, topic string }

type nopClosePublisher struct{ message.Publisher }

func (nopClosePublisher) Close() error { return nil }

// sheddingPressure is the signal priority shedding waits on
// (shedding.pressure). The lag sampler is built after the shedding policy,
// so the lag is read through r when asked, never before New returns.
func (r *Router) sheddingPressure(p string) spillway.Pressure {
	lag := func() time.Duration {
		if r.lagSampler == nil {
			return 0
		}
		return r.lagSampler.SaturatedFor()
	}
	switch p {
	case pressureLag:
		return spillway.PressureFunc(lag)
	case pressureEither:
		return spillway.PressureFunc(func() time.Duration { return max(r.budget.SaturatedFor(), lag()) })
	}
	return budgetPressure{r}
}

// budgetPressure is the budget's pressure signal for shedding and the
// retry gate: the whole budget's, and, for a message, its own lane's
// (middleware.Admitter.SaturatedForMessage) when the budget has lanes, so
// that a saturated heavy lane does not make the light lane shed or defer.
// The admission middleware is built after both, so it is read through r.
type budgetPressure struct{ r *Router }

func (p budgetPressure) SaturatedFor() time.Duration { return p.r.budget.SaturatedFor() }

func (p budgetPressure) SaturatedForMessage(msg *message.Message) time.Duration {
	if mw := p.r.budgetMW; mw != nil {
		return mw.SaturatedForMessage(msg)
	}
	return p.r.budget.SaturatedFor()
}
