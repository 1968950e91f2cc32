package router

import (
	"context"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/lazyctx"
)

// middlewareStack is the Spillway middleware stack, one named slot per layer,
// outermost first. The order is fixed here and nowhere else; docs/router.md
// explains it. A nil slot is absent.
//
//  1. Tracing ([telemetry.NewTracing]; unless
//     telemetry.disabled): outermost, so the consumer span, a child of the
//     producer's span, covers everything below it, including time spent
//     waiting for budget.
//  2. Metrics ([telemetry.Metrics.Middleware]; unless telemetry.disabled):
//     right inside tracing, so the processing duration covers the whole
//     stack too and the outcome the inner layers record labels it.
//  3. DeadLetter ([redisbroker.DeadLetter.Middleware]; on redis): moves
//     entries that could not be unmarshalled to redis.dead_letter_topic.
//     Outside the budget: a malformed message has no vertex_count and
//     would be charged the whole budget; outside shedding and the retry
//     gate, which have nothing to judge in it.
//  4. Shedding ([shedding.Policy.Middleware]; present when shedding.topics
//     is set): drops stale messages, and low-priority messages of
//     sheddable topics once the budget has been saturated for
//     shedding.priority.window, before they queue. Outside the budget, so
//     a dropped message never waits for budget nor holds any; outside the
//     retry gate, so it judges each delivery once, not every attempt, and
//     a message it drops never reaches the gate.
//  5. RetryGate ([retrygate.Gate.Middleware]; present unless retry.disabled):
//     retries failures with backoff from a retry budget, defers them to the
//     retry topic while the budget is saturated, dead-letters permanent
//     failures and payloads that cannot be decoded. Outside the budget, so a
//     message holds no vertices while it backs off and each attempt is
//     admitted afresh. With the gate off, the budget slot's malformed part
//     dead-letters the payloads that cannot be decoded.
//  6. Budget: admission against the vertex budget, innermost, so the
//     vertices are held exactly while the handler (and handler-level
//     middlewares) run. Its parts, outermost first, each a middleware of
//     its own:
//     a. "shutdown-gate" ([Router.shutdownGate]): once Close starts
//     nothing new gets in; opens a new delivery attempt for the Kafka
//     session tracker.
//     b. "admission" ([middleware.Admitter.Middleware]): its revocation hook is the Kafka
//     session's end and, with coalescing, the message being superseded.
//     c. "admitted" ([Router.admitted]): gives the handler its delivery context back
//     (with the admitted charge, for the auto-sizer), counts
//     running work for Close, reports completed deliveries to the Kafka
//     session tracker.
//     c′. "malformed" (with retry.disabled, in the gate's stead): a
//     message whose handler returned a decode error is dead-lettered
//     ([Router.moveMalformed]) and acked. Inside admission, so that the
//     copy is published before the message's vertices return; inside
//     "admitted", so that the Kafka session tracker sees it completed.
//     d. "shedding-admitted" ([shedding.Policy.Admitted]; with shedding):
//     re-checks a message after its wait, marks it admitted (no longer
//     supersedable) and records handled versions for the version guard.
//     Without it the guard never records and waiters are never
//     superseded.
//     e. "auto-sizer" ([sizing.AutoSizer.Middleware]; when
//     budget.autosize.enabled): innermost, so it times the handler's own
//     work only, never the wait for budget, and never a message that
//     shedding dropped after its wait.
//
// Outside all of them, and not a layer of its own in layers(), the
// router's settling layer follows each message until Watermill acks or
// nacks it, so Close never closes a subscriber under finished work whose
// ack is still on its way.
type middlewareStack struct {
	settle     message.HandlerMiddleware
	tracing    message.HandlerMiddleware
	metrics    message.HandlerMiddleware
	deadLetter message.HandlerMiddleware
	shedding   message.HandlerMiddleware
	retryGate  message.HandlerMiddleware
	budget     []layer
}

// layer is one named part of a stack slot.
type layer struct {
	name string
	mw   message.HandlerMiddleware
}

// middlewares returns the present layers, outermost first, ready for
// message.Router.AddMiddleware (the first added is the outermost).
func (s middlewareStack) middlewares() []message.HandlerMiddleware {
	var out []message.HandlerMiddleware
	for _, m := range []message.HandlerMiddleware{s.settle, s.tracing, s.metrics, s.deadLetter, s.shedding, s.retryGate} {
		if m != nil {
			out = append(out, m)
		}
	}
	for _, l := range s.budget {
		if l.mw != nil {
			out = append(out, l.mw)
		}
	}
	return out
}

// layers returns the names of the present slots, outermost first:
// tracing, metrics, dead-letter, shedding, retry-gate, budget.
func (s middlewareStack) layers() []string {
	var out []string
	for _, l := range []struct {
		name string
		m    message.HandlerMiddleware
	}{{"tracing", s.tracing}, {"metrics", s.metrics}, {"dead-letter", s.deadLetter},
		{"shedding", s.shedding}, {"retry-gate", s.retryGate}} {
		if l.m != nil {
			out = append(out, l.name)
		}
	}
	if len(s.budgetLayers()) > 0 {
		out = append(out, "budget")
	}
	return out
}

// budgetLayers returns the names of the budget slot's present parts,
// outermost first: shutdown-gate, admission, admitted, shedding-admitted,
// auto-sizer.
func (s middlewareStack) budgetLayers() []string {
	var out []string
	for _, l := range s.budget {
		if l.mw != nil {
			out = append(out, l.name)
		}
	}
	return out
}

// stack builds the router's stack from what New built. There is no
// recoverer slot: Watermill's router recovers a handler's panic itself and
// nacks the message, and the budget refunds on panic.
func (r *Router) stack() middlewareStack {
	s := middlewareStack{settle: r.settling.layer, deadLetter: r.deadLetter}
	if r.tracing != nil {
		s.tracing = r.tracing
	}
	if r.metrics != nil {
		s.metrics = r.metrics.Middleware
	}
	if r.policy != nil {
		s.shedding = r.policy.Middleware
	}
	if r.retry != nil {
		s.retryGate = func(h message.HandlerFunc) message.HandlerFunc { return r.retryScope(r.retry.Middleware(h)) }
	}
	s.budget = []layer{
		{name: "shutdown-gate", mw: r.shutdownGate},
		{name: "admission", mw: r.budgetMW.Middleware},
		{name: "admitted", mw: r.admitted},
	}
	if r.retry == nil {
		s.budget = append(s.budget, layer{name: "malformed", mw: r.malformedLayer})
	}
	if r.policy != nil {
		s.budget = append(s.budget, layer{name: "shedding-admitted", mw: r.policy.Admitted})
	}
	if r.sizer != nil {
		s.budget = append(s.budget, layer{name: "auto-sizer", mw: r.sizer.Middleware})
	}
	return s
}

// deliveryCtxKey holds the message's delivery context, set by retryScope
// for the layers inside the retry gate.
type deliveryCtxKey struct{}

// retryScope wraps the retry gate (when there is one): the gate backs off
// on the message's context, and a message backing off must not hold up
// Close, which waits for every message in the stack to settle. So the gate
// sees a context that also ends when Close starts; the delivery context is
// kept under deliveryCtxKey, so that admitted work below still runs on the
// delivery's lifetime (see gate).
func (r *Router) retryScope(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := new(retryContext)
		ctx.Init(msg.Context(), r.closingCtx)
		defer ctx.End()
		msg.SetContext(ctx)
		return h(msg)
	}
}

// retryContext is the context retryScope gives the retry gate: the
// delivery context's values, with the delivery context itself under
// deliveryCtxKey, and a lifetime that also ends when Close starts and when
// the scope returns. Its cancellation is built lazily (internal/lazyctx):
// the gate asks for Done only while it backs off, so a message that is
// not retried registers nothing with the router's closing context, which
// every message in flight would otherwise share.
type retryContext struct {
	lazyctx.Context // of the delivery context
}

// Value returns the delivery context for deliveryCtxKey and asks it
// otherwise.
func (c *retryContext) Value(key any) any {
	if _, ok := key.(deliveryCtxKey); ok {
		return c.Context.Context
	}
	return c.Context.Value(key)
}

// shutdownGate is the budget slot's first part: once the router is
// closing it lets nothing new in. A message arriving then is held, without
// running and without holding budget, until its delivery context ends (the
// subscriber is being closed), and is then nacked, so the broker keeps it.
// A message that passes the gate waits for budget (the admission part,
// [middleware.Admitter.Middleware]) on a context that is also cancelled when
// closing starts, so waiters give up at once and are nacked. The gate also
// opens a new delivery attempt for the Kafka session tracker.
func (r *Router) shutdownGate(h message.HandlerFunc) message.HandlerFunc {
	// Watermill decorates each handler with its own closure, so this one
	// serves a single handler, whose name its first message tells.
	var handler handlerName
	return func(msg *message.Message) ([]*message.Message, error) {
		d, err := r.enter(msg, &handler)
		if d == nil {
			return nil, err
		}
		defer r.leave(d)
		if d.tracker != nil {
			// A new delivery attempt, and the channel that tells the
			// budget its session ended (Router.revoked).
			d.tracker.Begin(msg)
			d.revoked = d.tracker.Revoked(msg)
		}
		msg.SetContext(d)
		return h(msg)
	}
}

// admitted is the budget slot's part right inside admission: the handler
// gets its delivery context back, unaffected by shutdown, so admitted work
// is never interrupted by Close; running work is counted for Close, and a
// success is reported to the Kafka session tracker.
func (r *Router) admitted(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d := deliveryFrom(msg.Context()) // the gate's
		if d == nil {
			return h(msg)
		}
		ctx := d.handlerCtx
		if c, ok := cost.AdmittedFromCtx(msg.Context()); ok {
			ctx = cost.WithAdmitted(ctx, c) // for the auto-sizer
		}
		msg.SetContext(ctx)
		d.shard.running.Add(1)
		defer d.shard.running.Add(-1)
		out, err := h(msg)
		if err == nil && d.tracker != nil {
			d.tracker.Completed(msg)
		}
		return out, err
	}
}

// enter lets msg through the gate and returns the delivery context it
// waits for budget with; the caller must call leave with it once the
// layers inside have returned. When the router is closing it holds msg
// until its delivery context ends and returns nil and that context's
// error instead.
func (r *Router) enter(msg *message.Message, handler *handlerName) (*delivery, error) {
	orig := msg.Context()
	// The handler's context: orig's values, and the delivery's
	// lifetime, even where retryScope made orig end with Close.
	life := orig
	if r.retry != nil {
		life = retryLife(orig)
	}
	if r.closingCtx.Err() != nil {
		return nil, r.hold(life)
	}
	d := newDelivery(orig)
	if d.shard == nil { // not the settling layer's: a later attempt
		d.shard = r.settling.pick()
	}
	d.handlerCtx = orig
	if life != orig {
		d.handlerLife = newHandlerContext(orig, life)
		d.handlerCtx = d.handlerLife
	}
	d.tracker = handler.trackerOf(orig, r)
	// Without the retry gate's scope, Close must end the wait here.
	// With it, orig already ends when Close starts, and the waiting
	// context with it, never before: the gate sees its own context
	// ended whenever a wait below gave up for shutdown, and so nacks
	// the message instead of counting a failed attempt.
	var closing context.Context
	if life == orig {
		closing = r.closingCtx
	}
	d.Init(orig, closing)
	return d, nil
}

// handlerName is the name of the handler a slot closure serves, read from
// the context of its first message that has one: the name does not change,
// and reading it walks the message's context chain. Safe for concurrent
// use.
type handlerName struct {
	p       atomic.Pointer[string]
	tracked atomic.Pointer[trackedBy] // see trackerOf
}

// of returns the handler's name, reading it from ctx the first time.
func (n *handlerName) of(ctx context.Context) string {
	if p := n.p.Load(); p != nil {
		return *p
	}
	name := message.HandlerNameFromCtx(ctx)
	if name != "" {
		p := new(string) // not &name: name would be allocated on every call
		*p = name
		n.p.Store(p)
	}
	return name
}

// trackedBy is a handler's delivery tracker as of one version of the
// router's trackers.
type trackedBy struct {
	version *map[string]deliveryTracker
	tracker deliveryTracker
}

// trackerOf returns the delivery tracker of the handler, nil if it has
// none: r.tracker(n.of(ctx)), looked up by name again only when r's
// trackers have changed since the last lookup, so that the name is not
// hashed on every message.
func (n *handlerName) trackerOf(ctx context.Context, r *Router) deliveryTracker {
	if c, v := n.tracked.Load(), r.trackers.Load(); c != nil && c.version == v {
		return c.tracker
	}
	return n.lookUp(ctx, r)
}

// lookUp is trackerOf's slow path.
func (n *handlerName) lookUp(ctx context.Context, r *Router) deliveryTracker {
	v := r.trackers.Load()
	name := n.of(ctx)
	var tr deliveryTracker
	if v != nil {
		tr = (*v)[name]
	}
	if name != "" {
		n.tracked.Store(&trackedBy{version: v, tracker: tr})
	}
	return tr
}

// retryLife returns the delivery context retryScope keeps in ctx, or ctx.
// Only retryScope sets it: without a retry gate the lookup would walk the
// whole context chain for nothing.
func retryLife(ctx context.Context) context.Context {
	if d, ok := ctx.Value(deliveryCtxKey{}).(context.Context); ok {
		return d
	}
	return ctx
}

// hold keeps a message that arrived after Close started until its delivery
// context (life) ends, and returns that context's error.
func (r *Router) hold(life context.Context) error {
	r.settling.held.Add(1)
	defer r.settling.held.Add(-1)
	<-life.Done()
	return life.Err()
}

// newHandlerContext returns the handler's context under the retry gate:
// values's values, life's lifetime.
func newHandlerContext(values, life context.Context) *handlerContext {
	hc := &handlerContext{values: values}
	hc.Init(life, nil)
	return hc
}

// leave is the way out of the gate for a delivery enter returned, after
// the handler returned, failed or panicked, or after admission refused it.
func (r *Router) leave(d *delivery) {
	d.End()
	if d.handlerLife != nil {
		d.handlerLife.End()
	}
}

// delivery is the context a message waits for budget with, set by the
// gate: orig's values and lifetime, also ended when Close starts (unless
// retryScope's context does that already) and when the gate returns. It
// carries what the layers inside the gate need (the handler's context and
// the handler's delivery tracker), so they find it without walking the
// context chain.
//
// Its cancellation is built lazily (internal/lazyctx): a message admitted
// at once (the common case, budget free) never asks for Done, and then
// costs one allocation instead of a cancellable context registered with
// both its parent and the router's closing context.
type delivery struct {
	// Of orig, the message context the gate received, also ended by the
	// router's closing context unless retryScope's context is.
	lazyctx.Context

	handlerCtx context.Context // the context the handler gets back once admitted
	tracker    deliveryTracker // nil when the broker has none

	// handlerLife is handlerCtx when it has a lifetime of its own (under
	// the retry gate, see Router.enter); leave ends it.
	handlerLife *handlerContext

	shard *settleShard // where the message counts as running (Router.admitted)
	// revoked is the tracker's Revoked channel for the message, asked by
	// the gate before admission; nil without a tracker.
	revoked <-chan struct{}
}

// handlerContext is the handler's context under the retry gate: the values
// of the context the gate received (the retry scope's, with the attempt),
// and the lifetime and deadline of the delivery context, which Close does
// not end. Its cancellation is built lazily (internal/lazyctx), and ends
// when the gate returns.
type handlerContext struct {
	lazyctx.Context                 // of the delivery context
	values          context.Context // the context the gate received
}

// Value asks the context the gate received.
func (c *handlerContext) Value(key any) any { return c.values.Value(key) }

// deliveryFrom returns the delivery context ctx is, or carries.
func deliveryFrom(ctx context.Context) *delivery {
	if d, ok := ctx.(*delivery); ok {
		return d
	}
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	return d
}

// deliveryKey finds a delivery below contexts derived from it.
type deliveryKey struct{}

// Value returns d for deliveryKey and asks orig otherwise.
func (d *delivery) Value(key any) any {
	if _, ok := key.(deliveryKey); ok {
		return d
	}
	return d.Context.Value(key)
}
