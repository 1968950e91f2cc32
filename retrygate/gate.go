package retrygate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spillway-go/spillway/internal/errtext"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/cenkalti/backoff/v5"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/copyctx"
)

// Metadata keys the gate reads and writes. The exported ones are on the
// dead-letter copy, which also carries Watermill's PoisonQueue keys and
// spillway_attempt (see [Gate.Middleware]); the others travel only on retry
// copies, between gates.
const (
	// attemptKey: handler runs so far over the message's life, base 10.
	// A message that carries a positive count is redelivered work. A
	// handler reads its attempt with [AttemptFromCtx].
	attemptKey = "spillway_attempt"
	// deferralsKey: how many times the message has been deferred.
	deferralsKey = "spillway_deferrals"
	// notBeforeKey: RFC 3339 time before which a deferred message should
	// not run; the gate holds an early arrival until then.
	notBeforeKey = "spillway_not_before"
	// OriginTopicKey: the topic the message was first consumed from.
	OriginTopicKey = "spillway_origin_topic"
	// lastErrorKey: the text of the handler's last error.
	lastErrorKey = "spillway_last_error"
	// DeadLetterCauseKey: on the dead-letter copy, "malformed" (the
	// payload cannot be decoded), "permanent" or "attempts_exhausted"; the
	// router also writes "oversize".
	DeadLetterCauseKey = "spillway_dead_letter_cause"
)

// maxBackoffSteps bounds how far a message's backoff schedule is advanced
// to resume it; any sane schedule has reached MaxInterval long before.
const maxBackoffSteps = 64

// maxAttemptCount bounds the attempt count read from metadata.
const maxAttemptCount = 1 << 20

// options are a gate's optional runtime dependencies, set by the With…
// functions.
type options struct {
	pub          message.Publisher
	pressure     spillway.Pressure
	isPermanent  func(error) bool
	isRedelivery func(*message.Message) bool
	revoked      func(msg *message.Message) <-chan struct{}
	onOutcome    func(Event)
	logger       watermill.LoggerAdapter
}

// Option configures a [Gate] built by [New].
type Option func(*options)

// WithPressure sets the saturation signal, the same one load shedding
// reads (*middleware.VertexBudget implements it). The gate calls it after
// every failure and on every redelivered arrival. Without it the consumer
// is never saturated, so failed messages are always retried in process
// while the retry budget and MaxElapsedTime allow.
func WithPressure(p spillway.Pressure) Option {
	return func(o *options) { o.pressure = p }
}

// WithIsPermanent sets the classifier of handler errors: true dead-letters
// the message at once. The default is [IsPermanent]; a classifier of your
// own can call it to keep its cases. An undecodable payload
// ([cost.IsUndecodable]) is dead-lettered whatever it says.
func WithIsPermanent(f func(error) bool) Option {
	return func(o *options) { o.isPermanent = f }
}

// WithRedelivery sets how broker-specific signs of a redelivery are read
// (a Redis delivery count above one, a Kafka partition replayed after a
// rebalance). A message whose spillway_attempt metadata is positive is a
// redelivery whatever f says. f is called from message goroutines and
// must be safe for concurrent use.
func WithRedelivery(f func(msg *message.Message) bool) Option {
	return func(o *options) { o.isRedelivery = f }
}

// WithRevoked sets how the gate learns that a delivery was revoked: f
// returns a channel that is closed when msg's Kafka session ended in a
// rebalance, or a peer claimed its Redis entry (nil: it cannot be
// revoked). A message waiting in the gate when that happens (the backoff
// before a retry in process, or a redelivered message held until its due
// time) stops waiting at once: the gate acks it without running the
// handler again and records it Deferred, cause "revoked". The broker does
// not commit the ack of a revoked delivery, so the next owner retries it.
// Without it such a wait holds the partition (and the rebalance, against
// Kafka's Rebalance.Timeout) until it ends. The gate asks only when a
// message is about to wait. middleware.WithRevoked takes the
// same function.
func WithRevoked(f func(msg *message.Message) <-chan struct{}) Option {
	return func(o *options) { o.revoked = f }
}

// WithOnOutcome sets a hook called once per delivery when its outcome is
// decided, from the message's goroutine, before the middleware returns.
// It must be fast, must not block and must not keep the Event (nor its
// Message) beyond the call. telemetry.Metrics.OnRetryOutcome fits it.
func WithOnOutcome(f func(Event)) Option {
	return func(o *options) { o.onOutcome = f }
}

// WithLogger sets the logger of dead-letters and failed publishes.
// Default: none.
func WithLogger(l watermill.LoggerAdapter) Option {
	return func(o *options) { o.logger = l }
}

// Gate is a Watermill middleware that retries failed handlers with
// exponential backoff and jitter, draws every retry from a shared retry
// budget, defers failed and redelivered work instead of retrying it while
// the consumer is saturated, and dead-letters messages that fail for good.
//
// Each delivery ends in exactly one [Outcome]: handled, deferred,
// dead-lettered or nacked.
//
// A Gate is safe for concurrent use. One Gate may wrap any number of
// handlers; they then share its retry budget, and its counters are kept
// by consumed topic.
type Gate struct {
	cfg     Config
	opts    options
	budget  *retryBudget
	counts  topicCounters
	maxHold time.Duration
}

// New returns a gate for cfg (zero fields take their defaults) that
// publishes retry and dead-letter copies with pub. The publisher is a
// parameter, not an option, because no gate runs without one: even with
// [DeferNack] a message that fails for good is published to its
// dead-letter topic. pub is called from message goroutines and must be
// safe for concurrent use; the gate does not close it. Errors are those of
// [Config.Validate], or a [*spillway.FieldError] for "pub" if it is nil.
func New(pub message.Publisher, cfg Config, opts ...Option) (*Gate, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pub == nil {
		return nil, &spillway.FieldError{Field: "pub", Value: "nil", Reason: "required: the gate publishes retry and dead-letter copies with it"}
	}
	o := options{pub: pub}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.isPermanent == nil {
		o.isPermanent = IsPermanent
	}
	if o.logger == nil {
		o.logger = watermill.NopLogger{}
	}
	return &Gate{
		cfg:     cfg,
		opts:    o,
		budget:  newRetryBudget(cfg),
		maxHold: min(2*cfg.MaxInterval, cfg.MaxElapsedTime),
	}, nil
}

// Stats returns a snapshot of the gate's counters. Each counter is read
// atomically, the set of them is not.
func (g *Gate) Stats() Stats {
	c := g.counts.snapshot()
	return Stats{
		Handled:      c.handled,
		Deferred:     c.deferred,
		DeadLettered: c.deadLettered,
		Nacked:       c.nacked,
		Retries:      c.retries,
		Revoked:      c.revoked,
		RetryTokens:  g.budget.tokens(),
	}
}

// messagePressure is a pressure signal that can also judge one message by
// the part of the consumer it needs (middleware.Admitter.SaturatedForMessage).
type messagePressure interface {
	SaturatedForMessage(msg *message.Message) time.Duration
}

// saturated reports whether the gate currently treats the consumer, or
// msg's part of it, as saturated: the pressure signal has reported
// saturation for at least Config.SaturatedAfter.
func (g *Gate) saturated(msg *message.Message) bool {
	if g.opts.pressure == nil {
		return false
	}
	var d time.Duration
	if mp, ok := g.opts.pressure.(messagePressure); ok && msg != nil {
		// A budget split into lanes: the message's own lane.
		d = mp.SaturatedForMessage(msg)
	} else {
		d = g.opts.pressure.SaturatedFor()
	}
	return d > 0 && d >= g.cfg.SaturatedAfter
}

type attemptCtxKey struct{}

// AttemptFromCtx returns which attempt of the message the handler is
// running, counting from 1 over the message's whole life, or 0 if ctx is
// not a message context set by a gate. Read it from msg.Context().
func AttemptFromCtx(ctx context.Context) int {
	n, _ := ctx.Value(attemptCtxKey{}).(int)
	return n
}

// Middleware wraps h with the retry gate. Its slot in the stack is outside
// the budget admission middleware, so that every attempt is admitted and
// refunded on its own and nothing is held while it waits.
//
// For each delivery:
//
//  1. A deferred message that arrives before its spillway_not_before time waits
//     until then (at most min(2 × MaxInterval, MaxElapsedTime)).
//  2. Redelivered work (spillway_attempt > 0, or [WithRedelivery]) that
//     arrives while the consumer is saturated is deferred again at once,
//     without running h: under pressure, retries give way to fresh work.
//     Otherwise it draws a retry token, and is deferred if there is none.
//  3. h runs. On success the message is handled. On failure it is
//     dead-lettered if the payload cannot be decoded ([cost.IsUndecodable],
//     cause "malformed"), the error is permanent or the attempts are used up;
//     deferred if the consumer is saturated, the next backoff wait would
//     run past MaxElapsedTime, or the retry budget is empty; otherwise the
//     gate waits the backoff interval and runs h again. Every wait ends at
//     once when the message context does, and the message is nacked. Any
//     error once the message context has ended is not a failure but
//     abandoned work: the message is nacked without retry or dead-letter.
//     Only the message's own context counts: an error that wraps
//     context.Canceled while that context is alive (a client the handler
//     called gave up, say) is an ordinary failure, counted as an attempt.
//
// Before each run the message's context is reset to the one it arrived
// with (plus the attempt number, see [AttemptFromCtx]), so a context that
// an inner middleware cancelled does not doom the retry.
//
// The dead-letter copy keeps the UUID, payload and metadata and adds
// reason_poisoned, topic_poisoned, handler_poisoned and
// subscriber_poisoned (Watermill's PoisonQueue keys), spillway_attempt,
// OriginTopicKey and DeadLetterCauseKey. The retry copy keeps the UUID too,
// so it can be traced and deduplicated, and carries spillway_attempt,
// spillway_deferrals, spillway_not_before (its due time), OriginTopicKey and
// spillway_last_error (the handler's last error). Error text in metadata
// is cut to 1 KiB. A failed publish to either topic nacks the original:
// nothing is dropped.
//
// Both copies are published with the delivery's context, so a tracing
// publisher makes their producer spans children of the delivery's consumer
// span. The origin topic, which names both destinations, is the topic the
// message was consumed from, or the OriginTopicKey of a message consumed
// from that origin's retry topic; OriginTopicKey on any other message is
// ignored.
//
// A panic in h is counted (Nacked, causePanic) and passed on unchanged.
func (g *Gate) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d := g.arrive(msg)
		defer func() {
			if d.done {
				return
			}
			if r := recover(); r != nil {
				d.end(Nacked, causePanic, "", fmt.Errorf("retrygate: handler panicked: %v", r))
				panic(r)
			}
		}()
		return d.run(h)
	}
}

// delivery is one message's passage through the gate.
type delivery struct {
	g     *Gate
	msg   *message.Message
	ctx   context.Context // as delivered
	start time.Time

	topic, handler, origin string

	attempts, deferrals int
	redelivered         bool
	retries             int
	lastErr             error
	bo                  *backoff.ExponentialBackOff // made by backoff
	boSkip              int                         // the waits earlier deliveries used, for backoff
	done                bool
}

func (g *Gate) arrive(msg *message.Message) *delivery {
	ctx := msg.Context()
	d := &delivery{
		g:        g,
		msg:      msg,
		ctx:      ctx,
		start:    time.Now(),
		topic:    message.SubscribeTopicFromCtx(ctx),
		handler:  message.HandlerNameFromCtx(ctx),
		attempts: readCount(msg, attemptKey),
	}
	d.deferrals = readCount(msg, deferralsKey)
	d.origin = g.originOf(msg, d.topic)
	d.redelivered = d.attempts > 0 || (g.opts.isRedelivery != nil && g.opts.isRedelivery(msg))
	d.boSkip = d.attempts + d.deferrals
	return d
}

// backoff returns the delivery's backoff schedule, made the first time a
// wait or a deferral needs it: a message that succeeds at once never needs
// one.
func (d *delivery) backoff() *backoff.ExponentialBackOff {
	if d.bo == nil {
		d.bo = d.g.newBackOff(d.boSkip)
	}
	return d.bo
}

// originOf returns the topic msg originates from: the one OriginTopicKey
// names when msg was consumed from that topic's retry topic, and otherwise
// topic itself. The key is trusted nowhere else: a handler or producer that
// copied it onto another message must not send that message's retries and
// dead letters to a topic it was never consumed from.
func (g *Gate) originOf(msg *message.Message, topic string) string {
	if o := msg.Metadata.Get(OriginTopicKey); o != "" && o != topic &&
		g.cfg.Defer == DeferRepublish && g.cfg.RetryTopicFor(o) == topic {
		return o
	}
	return topic
}

func readCount(msg *message.Message, key string) int {
	v := msg.Metadata.Get(key)
	if v == "" {
		// A fresh message, the common case: no error value built.
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0
	}
	return min(n, maxAttemptCount)
}

// newBackOff returns the message's backoff schedule, advanced past the
// waits its earlier failures and deferrals already used.
func (g *Gate) newBackOff(skip int) *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     g.cfg.InitialInterval,
		RandomizationFactor: max(0, g.cfg.Jitter),
		Multiplier:          g.cfg.Multiplier,
		MaxInterval:         g.cfg.MaxInterval,
	}
	b.Reset()
	for range min(skip, maxBackoffSteps) {
		b.NextBackOff()
	}
	return b
}

func (d *delivery) run(h message.HandlerFunc) ([]*message.Message, error) {
	g := d.g
	if !d.redelivered {
		g.budget.earn()
	}
	if err := d.holdUntilDue(); errors.Is(err, errRevoked) {
		return d.stepAside()
	} else if err != nil {
		return d.nack(causeContextDone, err)
	}
	if d.redelivered {
		if g.saturated(d.msg) {
			return d.deferMsg(causeSaturatedOnArrival, d.backoff().NextBackOff())
		}
		if !g.budget.take() {
			g.counts.get(d.topic).budgetDenied.Add(1)
			return d.deferMsg(causeRetryBudget, d.backoff().NextBackOff())
		}
	}
	for {
		d.attempts++
		d.msg.SetContext(context.WithValue(d.ctx, attemptCtxKey{}, d.attempts))
		out, err := h(d.msg)
		if err == nil {
			d.end(Handled, causeNone, "", nil)
			return out, nil
		}
		d.lastErr = err
		switch {
		case d.ctx.Err() != nil:
			// The work was abandoned, not failed: the delivery is ending
			// (a layer below gave up its wait on it: budget admission
			// during shutdown, say). Nack it for redelivery. An error that
			// merely wraps context.Canceled while the delivery lives on is
			// an ordinary failure: exempting it would redeliver the
			// message forever without counting an attempt.
			return d.nack(causeContextDone, err)
		case cost.IsUndecodable(err):
			return d.deadLetter(causeMalformed)
		case g.opts.isPermanent(err):
			return d.deadLetter(causePermanent)
		case d.attempts >= g.cfg.MaxAttempts:
			return d.deadLetter(causeAttemptsExhausted)
		case g.saturated(d.msg):
			return d.deferMsg(causeSaturated, d.backoff().NextBackOff())
		}
		wait := d.backoff().NextBackOff()
		if time.Since(d.start)+wait > g.cfg.MaxElapsedTime {
			return d.deferMsg(causeMaxElapsed, wait)
		}
		if !g.budget.take() {
			g.counts.get(d.topic).budgetDenied.Add(1)
			return d.deferMsg(causeRetryBudget, wait)
		}
		if err := sleep(d.ctx, wait, d.revoked()); errors.Is(err, errRevoked) {
			return d.stepAside()
		} else if err != nil {
			return d.nack(causeContextDone, err)
		}
		if g.saturated(d.msg) {
			// Pressure rose while we waited; the token is spent, the
			// retry is not.
			return d.deferMsg(causeSaturated, d.backoff().NextBackOff())
		}
		d.retries++
		g.counts.get(d.topic).retries.Add(1)
	}
}

// holdUntilDue waits until the message's notBeforeKey time, if it has one
// in the future, bounded by maxHold.
func (d *delivery) holdUntilDue() error {
	v := d.msg.Metadata.Get(notBeforeKey)
	if v == "" {
		return nil
	}
	due, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return nil
	}
	wait := min(time.Until(due), d.g.maxHold)
	if wait <= 0 {
		return nil
	}
	return sleep(d.ctx, wait, d.revoked())
}

// errRevoked ends a wait whose delivery was revoked ([WithRevoked]).
var errRevoked = errors.New("retrygate: delivery revoked")

// revoked returns the delivery's revocation channel, nil when it cannot
// be revoked.
func (d *delivery) revoked() <-chan struct{} {
	if f := d.g.opts.revoked; f != nil {
		return f(d.msg)
	}
	return nil
}

// stepAside ends a revoked delivery: acked, not run again, and not
// committed by the broker, so the next owner retries it.
func (d *delivery) stepAside() ([]*message.Message, error) {
	d.g.counts.get(d.topic).revoked.Add(1)
	d.end(Deferred, causeRevoked, "", nil)
	return nil, nil
}

// sleep waits for d or until ctx ends, returning ctx.Err() in that case,
// or until revoked is closed, returning errRevoked.
func sleep(ctx context.Context, d time.Duration, revoked <-chan struct{}) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-revoked:
		return errRevoked
	default:
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-revoked:
		return errRevoked
	}
}

// deferMsg hands the message back for a retry no earlier than delay from
// now.
func (d *delivery) deferMsg(cause string, delay time.Duration) ([]*message.Message, error) {
	g := d.g
	deferrals := d.deferrals + 1
	stamp := func(m *message.Message) {
		m.Metadata.Set(attemptKey, strconv.Itoa(d.attempts))
		m.Metadata.Set(deferralsKey, strconv.Itoa(deferrals))
		m.Metadata.Set(notBeforeKey, time.Now().Add(delay).UTC().Format(time.RFC3339Nano))
		m.Metadata.Set(OriginTopicKey, d.origin)
		if d.lastErr != nil {
			m.Metadata.Set(lastErrorKey, errtext.Cut(d.lastErr))
		}
	}
	if cause == causeSaturatedOnArrival {
		g.counts.get(d.topic).onArrival.Add(1)
	}
	if g.cfg.Defer == DeferNack {
		// Best effort: Kafka and Redis Streams subscribers resend the
		// delivered message object after a nack, so the count and due time
		// survive in-process redelivery; GoChannel resends the original.
		stamp(d.msg)
		d.end(Deferred, cause, "", d.lastErr)
		if d.lastErr != nil {
			return nil, fmt.Errorf("%w: %w", errDeferred, d.lastErr)
		}
		return nil, fmt.Errorf("%w (%s)", errDeferred, cause)
	}
	cp := d.copy()
	stamp(cp)
	dest := g.cfg.RetryTopicFor(d.origin)
	if err := g.opts.pub.Publish(dest, cp); err != nil {
		g.opts.logger.Error("retrygate: cannot publish to retry topic; nacking", err, d.logFields(dest))
		return d.nack(causePublishFailed, fmt.Errorf("retrygate: publishing to retry topic %q: %w", dest, err))
	}
	d.end(Deferred, cause, dest, d.lastErr)
	return nil, nil
}

func (d *delivery) deadLetter(cause string) ([]*message.Message, error) {
	g := d.g
	cp := d.copy()
	delete(cp.Metadata, notBeforeKey)
	cp.Metadata.Set(wmw.ReasonForPoisonedKey, errtext.Cut(d.lastErr))
	cp.Metadata.Set(wmw.PoisonedTopicKey, d.topic)
	cp.Metadata.Set(wmw.PoisonedHandlerKey, d.handler)
	cp.Metadata.Set(wmw.PoisonedSubscriberKey, message.SubscriberNameFromCtx(d.ctx))
	cp.Metadata.Set(attemptKey, strconv.Itoa(d.attempts))
	cp.Metadata.Set(OriginTopicKey, d.origin)
	cp.Metadata.Set(DeadLetterCauseKey, cause)
	dest := g.cfg.DeadLetterTopicFor(d.origin)
	if err := g.opts.pub.Publish(dest, cp); err != nil {
		g.opts.logger.Error("retrygate: cannot publish to dead-letter topic; nacking", err, d.logFields(dest))
		return d.nack(causePublishFailed, fmt.Errorf("retrygate: publishing to dead-letter topic %q: %w", dest, err))
	}
	f := d.logFields(dest)
	f["cause"] = cause
	g.opts.logger.Info("retrygate: message dead-lettered: "+errtext.Cut(d.lastErr), f)
	d.end(DeadLettered, cause, dest, d.lastErr)
	return nil, nil
}

// copy returns the copy of the message that goes to the retry or
// dead-letter topic: UUID, payload and metadata as delivered (so it keeps
// the charge it was stamped with, if any, and is published as it is, never
// counted again), and the delivery's context without its cancellation, so
// a tracing publisher continues the delivery's trace (the copy's producer
// span is a child of the consumer span) and a publisher that reads the
// context is not stopped by the delivery ending. A Kafka publisher keys it
// by the delivered record's key (internal/copyctx).
func (d *delivery) copy() *message.Message {
	cp := d.msg.Copy()
	cp.SetContext(copyctx.Of(d.ctx))
	return cp
}

// nack ends the delivery with err, which the router turns into a nack.
func (d *delivery) nack(cause string, err error) ([]*message.Message, error) {
	d.end(Nacked, cause, "", err)
	return nil, err
}

// end records the outcome, restores the message context and reports the
// event.
func (d *delivery) end(o Outcome, c string, dest string, err error) {
	d.done = true
	d.msg.SetContext(d.ctx)
	ctr := d.g.counts.get(d.topic)
	switch o {
	case Handled:
		ctr.handled.Add(1)
	case Deferred:
		ctr.deferred.Add(1)
	case DeadLettered:
		ctr.deadLettered.Add(1)
	case Nacked:
		ctr.nacked.Add(1)
	}
	if f := d.g.opts.onOutcome; f != nil {
		f(Event{
			Message:     d.msg,
			Topic:       d.topic,
			Outcome:     o,
			Cause:       c,
			Err:         err,
			attempts:    d.attempts,
			redelivered: d.redelivered,
			retries:     d.retries,
			destination: dest,
			elapsed:     time.Since(d.start),
		})
	}
}

func (d *delivery) logFields(dest string) watermill.LogFields {
	return watermill.LogFields{
		"message_uuid": d.msg.UUID,
		"topic":        d.topic,
		"handler":      d.handler,
		"destination":  dest,
		"attempts":     d.attempts,
	}
}
