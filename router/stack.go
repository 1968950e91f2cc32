package router

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
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
//  5. RetryGate ([retrygate.Gate.Middleware]; present when retry.enabled):
//     retries failures with backoff from a retry budget, defers them to the
//     retry topic while the budget is saturated, dead-letters permanent
//     failures. Outside the budget, so a message holds no vertices while it
//     backs off and each attempt is admitted afresh.
//  6. Budget: admission against the vertex budget, innermost, so the
//     vertices are held exactly while the handler (and handler-level
//     middlewares) run. Its parts, outermost first:
//     a. "shutdown-gate": once Close starts nothing new gets in; opens a
//     new delivery attempt for the Kafka session tracker.
//     b. "admission": [middleware.Budget]; its Revoked hook is the Kafka
//     session's end and, with coalescing, the message being superseded.
//     c. "admitted": gives the handler its delivery context back, counts
//     running work for Close, reports completed deliveries to the Kafka
//     session tracker.
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
// Outside all of them, and not a layer of its own in [Router.Layers], the
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
	s.budget = []layer{{"shutdown-gate", r.gate}}
	if r.budgetMW != nil {
		// Without it (a control configuration of the tests) there is no
		// admission at all, but the shutdown gate and in-flight
		// accounting stay.
		s.budget = append(s.budget, layer{"admission", r.budgetMW.Middleware})
	}
	s.budget = append(s.budget, layer{"admitted", r.admitted})
	if r.policy != nil {
		s.budget = append(s.budget, layer{"shedding-admitted", r.policy.Admitted})
	}
	if r.sizer != nil {
		s.budget = append(s.budget, layer{"auto-sizer", r.sizer.Middleware})
	}
	return s
}

// handlerCtxKey holds, in the context a message waits for budget with, the
// context its handler gets once admitted.
type handlerCtxKey struct{}

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
		orig := msg.Context()
		ctx, cancel := context.WithCancel(context.WithValue(orig, deliveryCtxKey{}, orig))
		stop := context.AfterFunc(r.closingCtx, cancel)
		defer func() {
			stop()
			cancel()
		}()
		msg.SetContext(ctx)
		return h(msg)
	}
}

// gate is the entrance of the budget slot. Once the router is closing it
// lets nothing new in: a message arriving then is held, without running
// and without holding budget, until its delivery context ends (the
// subscriber is being closed), and is then nacked, so the broker keeps it.
// A message that passed the gate waits for budget on a context that is also
// cancelled when closing starts, so waiters give up at once and are nacked.
// It also opens a new delivery attempt for the Kafka session tracker.
func (r *Router) gate(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		orig := msg.Context()
		// The handler's context: orig's values, and the delivery's
		// lifetime, even where retryScope made orig end with Close.
		handlerCtx, life := orig, orig
		if d, ok := orig.Value(deliveryCtxKey{}).(context.Context); ok {
			life = d
		}
		if r.closingCtx.Err() != nil {
			r.settling.held.Add(1)
			defer r.settling.held.Add(-1)
			<-life.Done()
			return nil, life.Err()
		}
		if life != orig {
			var cancelH context.CancelFunc
			handlerCtx, cancelH = context.WithCancel(context.WithoutCancel(orig))
			stopH := context.AfterFunc(life, cancelH)
			defer func() {
				stopH()
				cancelH()
			}()
		}
		handler := message.HandlerNameFromCtx(orig)
		if t := r.tracker(handler); t != nil {
			t.Begin(msg)
		}
		r.annotateGroup(msg, handler)
		r.entered.Add(1)
		defer r.entered.Add(-1)
		ctx, cancel := context.WithCancel(context.WithValue(orig, handlerCtxKey{}, handlerCtx))
		defer cancel()
		if life == orig {
			// Without the retry gate's scope, Close must end the wait
			// here. With it, orig already ends when Close starts, and
			// ctx with it, never before: the gate sees its own context
			// ended whenever a wait below gave up for shutdown, and so
			// nacks the message instead of counting a failed attempt.
			stop := context.AfterFunc(r.closingCtx, cancel)
			defer stop()
		}
		msg.SetContext(ctx)
		return h(msg)
	}
}

// admitted runs inside the budget: the message has been admitted (or there
// is no budget). It gives the handler back its delivery context, unaffected
// by shutdown, so admitted work is never interrupted by Close, and records
// successful completion for the Kafka session tracker.
func (r *Router) admitted(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if orig, ok := msg.Context().Value(handlerCtxKey{}).(context.Context); ok {
			msg.SetContext(orig)
		}
		r.running.Add(1)
		defer r.running.Add(-1)
		out, err := h(msg)
		if err == nil {
			if t := r.tracker(message.HandlerNameFromCtx(msg.Context())); t != nil {
				t.Completed(msg)
			}
		}
		return out, err
	}
}
