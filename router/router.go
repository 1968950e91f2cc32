package router

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
)

// ErrNotSupported is returned by [New] for a broker that Config accepts but
// this version cannot run yet (redis).
var ErrNotSupported = errors.New("router: broker not supported yet")

// Option customises a [Router] beyond its Config: things that are code,
// not configuration.
type Option func(*options)

type options struct {
	onAdmission func(*message.Message, middleware.Admission)
	estimator   middleware.Estimator
	tracer      kafka.SaramaTracer

	// Test-only switches, for the control runs of the rebalance test.
	noBudget     bool
	noRevocation bool
	// sarama tweaks the Sarama configs after they are built (tests).
	saramaHook func(sub bool, c any)
}

// WithOnAdmission calls f once per message after admission is decided (see
// [middleware.BudgetConfig.OnAdmission]): for metrics and logs. It must be
// fast and must not block.
func WithOnAdmission(f func(*message.Message, middleware.Admission)) Option {
	return func(o *options) { o.onAdmission = f }
}

// WithEstimator replaces the estimator built from Config.Budget.
func WithEstimator(e middleware.Estimator) Option {
	return func(o *options) { o.estimator = e }
}

// WithSaramaTracer composes a watermill-kafka tracer (for example
// kafka.NewOTELSaramaTracer()) with the router's own session tracker. It is
// used by the Kafka publisher and every Kafka subscriber; the memory broker
// ignores it.
func WithSaramaTracer(t kafka.SaramaTracer) Option {
	return func(o *options) { o.tracer = t }
}

// Router is a Watermill router with the Spillway middleware stack in front
// of every handler and a publisher and subscribers for the configured
// broker. Handler code is the same for every broker. Create it with [New],
// add handlers, then [Router.Run]; stop it with [Router.Close], SIGINT or
// SIGTERM.
type Router struct {
	cfg    Config
	logger watermill.LoggerAdapter
	opts   options

	wm       *message.Router
	back     backend
	pub      message.Publisher // stamping, over back.publisher()
	budget   *middleware.VertexBudget
	budgetMW *middleware.Budget

	mu       sync.Mutex
	trackers map[string]*SessionTracker
	topics   map[string]string // handler name -> subscribed topic
	subs     []message.Subscriber
	runCtx   context.Context
	ran      bool

	closingCtx    context.Context
	closingCancel context.CancelFunc
	closeOnce     sync.Once
	closeErr      error
	closed        chan struct{}

	entered atomic.Int64 // messages past the shutdown gate
	running atomic.Int64 // messages admitted and in their handler
}

// New builds a router for cfg: the broker's publisher and subscriber
// factory, the vertex budget and the middleware stack. cfg gets its defaults
// and is validated first. A nil logger logs nothing. For kafka with brokers
// [embedded] it starts an in-process broker that Close stops.
func New(cfg Config, logger watermill.LoggerAdapter, opts ...Option) (*Router, error) {
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return newRouter(cfg, logger, o)
}

func newRouter(cfg Config, logger watermill.LoggerAdapter, o options) (*Router, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	r := &Router{
		cfg:      cfg,
		logger:   logger,
		opts:     o,
		trackers: make(map[string]*SessionTracker),
		topics:   make(map[string]string),
		closed:   make(chan struct{}),
	}
	r.closingCtx, r.closingCancel = context.WithCancel(context.Background())

	var err error
	switch cfg.Broker {
	case BrokerMemory:
		r.back = newMemoryBackend(logger)
	case BrokerKafka:
		r.back, err = newKafkaBackend(cfg.Kafka, logger, o)
	default:
		return nil, fmt.Errorf("%w: %s (see docs/router.md)", ErrNotSupported, cfg.Broker)
	}
	if err != nil {
		return nil, err
	}

	var bopts []middleware.Option
	if cfg.Budget.MessageLimit > 0 {
		bopts = append(bopts, middleware.WithMessageLimit(cfg.Budget.MessageLimit))
	}
	r.budget = middleware.NewVertexBudget(cfg.Budget.Vertices, bopts...)
	if !o.noBudget {
		est := o.estimator
		if est == nil {
			var eopts []cost.EstimatorOption
			if cfg.Budget.ComputeMissing {
				eopts = append(eopts, cost.WithComputeMissing())
			}
			est = cost.NewEstimator(cfg.Budget.DefaultCost, eopts...)
		}
		bc := middleware.BudgetConfig{Budget: r.budget, Estimator: est, OnAdmission: o.onAdmission}
		if cfg.Broker == BrokerKafka && !o.noRevocation {
			bc.Revoked = r.revoked
		}
		r.budgetMW, err = middleware.NewBudget(bc)
		if err != nil {
			_ = r.back.close()
			return nil, err
		}
	}

	r.wm, err = message.NewRouter(message.RouterConfig{CloseTimeout: cfg.CloseTimeout}, logger)
	if err != nil {
		_ = r.back.close()
		return nil, err
	}
	r.wm.AddMiddleware(r.stack().Middlewares()...)
	r.pub = cost.NewStampingPublisher(r.back.publisher())
	return r, nil
}

// Config returns the configuration the router runs with (defaults filled).
func (r *Router) Config() Config { return r.cfg }

// Publisher returns the broker's publisher, wrapped so that every message
// published through it is stamped with its vertex_count. It stays open
// until the router is closed; do not close it yourself.
func (r *Router) Publisher() message.Publisher { return nopClosePublisher{r.pub} }

// Budget returns the vertex budget every handler is admitted against.
func (r *Router) Budget() *middleware.VertexBudget { return r.budget }

// BudgetMiddleware returns the budget middleware (nil only in test control
// configurations): Revocations and Cancellations count here.
func (r *Router) BudgetMiddleware() *middleware.Budget { return r.budgetMW }

// Stack returns the middleware stack in front of every handler.
func (r *Router) Stack() Stack { return r.stack() }

// Watermill returns the underlying Watermill router, for plugins and
// handler-level middlewares. Run and Close it through the Router only.
func (r *Router) Watermill() *message.Router { return r.wm }

// SessionTracker returns the Kafka session tracker of handler, or nil (not
// a Kafka handler, or revocation-awareness is off).
func (r *Router) SessionTracker(handler string) *SessionTracker { return r.tracker(handler) }

func (r *Router) tracker(handler string) *SessionTracker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.trackers[handler]
}

func (r *Router) revoked(msg *message.Message) <-chan struct{} {
	if t := r.tracker(message.HandlerNameFromCtx(msg.Context())); t != nil {
		return t.Revoked(msg)
	}
	return nil
}

// AddHandler adds a handler named name that consumes subscribeTopic and
// publishes what it returns to publishTopic, through the stamping
// publisher. On Kafka the topic is created if missing (embedded broker, or
// kafka.create_topics) and the handler consumes in its own consumer group,
// "<kafka.consumer_group>.<name>". It may be called before or after Run.
func (r *Router) AddHandler(name, subscribeTopic, publishTopic string, h message.HandlerFunc) (*message.Handler, error) {
	if publishTopic == "" {
		return nil, fmt.Errorf("router: handler %q: empty publish topic (use AddConsumerHandler)", name)
	}
	if err := r.back.ensureTopic(publishTopic); err != nil {
		return nil, err
	}
	sub, err := r.subscriber(name, subscribeTopic)
	if err != nil {
		return nil, err
	}
	mh := r.wm.AddHandler(name, subscribeTopic, sub, publishTopic, nopClosePublisher{r.pub}, h)
	return mh, r.startIfRunning()
}

// AddConsumerHandler adds a handler that publishes nothing (it may still
// use [Router.Publisher] directly). See AddHandler.
func (r *Router) AddConsumerHandler(name, topic string, h message.NoPublishHandlerFunc) (*message.Handler, error) {
	sub, err := r.subscriber(name, topic)
	if err != nil {
		return nil, err
	}
	mh := r.wm.AddConsumerHandler(name, topic, sub, h)
	return mh, r.startIfRunning()
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
		r.trackers[name] = tr
	}
	r.subs = append(r.subs, sub)
	return sub, nil
}

func (r *Router) newSubscriber(name, topic string) (message.Subscriber, *SessionTracker, error) {
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
// by SIGINT or SIGTERM, or by ctx ending, each of which shuts down
// gracefully (see Close). It returns nil after a graceful shutdown.
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
	r.ran = true
	// Subscribers get a context that outlives ctx: shutdown must go
	// through Close, which drains admitted work before they stop.
	r.runCtx = context.WithoutCancel(ctx)
	r.mu.Unlock()

	sigCtx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

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

// Running is closed once the router is running (Watermill's Running).
func (r *Router) Running() chan struct{} { return r.wm.Running() }

// Closed is closed when Close has finished.
func (r *Router) Closed() <-chan struct{} { return r.closed }

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

func (r *Router) close() error {
	r.closingCancel()
	deadline := time.Now().Add(r.cfg.CloseTimeout)
	var errs []error
	for r.entered.Load() > 0 {
		if time.Now().After(deadline) {
			errs = append(errs, fmt.Errorf("router: close: %d admitted messages still running after %s", r.running.Load(), r.cfg.CloseTimeout))
			break
		}
		time.Sleep(5 * time.Millisecond)
	}

	r.mu.Lock()
	ran := r.ran
	subs := r.subs
	r.mu.Unlock()
	if ran {
		if err := r.wm.Close(); err != nil {
			errs = append(errs, fmt.Errorf("router: close: %w", err))
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
	return errors.Join(errs...)
}

// Stats is a snapshot of the router's admission state.
type Stats struct {
	Budget        middleware.BudgetStats
	Running       int64  // messages admitted and in their handler
	Revocations   uint64 // waiting messages that stepped aside (Kafka rebalance)
	Cancellations uint64 // waiting messages that gave up (shutdown)
	LateMarks     uint64 // acks committed after their session ended (Kafka)
	Evictions     uint64 // times a member came back under a new member id (Kafka)
}

// Stats returns a snapshot.
func (r *Router) Stats() Stats {
	s := Stats{Budget: r.budget.Stats(), Running: r.running.Load()}
	if r.budgetMW != nil {
		s.Revocations = r.budgetMW.Revocations()
		s.Cancellations = r.budgetMW.Cancellations()
	}
	r.mu.Lock()
	for _, t := range r.trackers {
		s.LateMarks += t.LateMarks()
		s.Evictions += t.Evictions()
	}
	r.mu.Unlock()
	return s
}

// ErrLagUnknown is returned by [Router.Lag] when the broker cannot report
// consumer lag (memory).
var ErrLagUnknown = errors.New("router: consumer lag unknown for this broker")

// Lag returns how many messages the router's handlers have yet to commit,
// summed over their topics and partitions: the high water mark minus the
// group's committed offset (a partition never committed counts from its
// oldest retained offset).
func (r *Router) Lag(ctx context.Context) (int64, error) {
	r.mu.Lock()
	groups := make([]groupTopic, 0, len(r.topics))
	for name, topic := range r.topics {
		groups = append(groups, groupTopic{handler: name, topic: topic})
	}
	r.mu.Unlock()
	return r.back.lag(ctx, groups)
}

type groupTopic struct{ handler, topic string }

type nopClosePublisher struct{ message.Publisher }

func (nopClosePublisher) Close() error { return nil }
