package router

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Stack is the Spillway middleware stack, one named slot per layer,
// outermost first. The order is fixed here and nowhere else; docs/router.md
// explains it. A nil slot is absent.
//
//  1. Tracing: outermost, so a span covers everything below it, including
//     time spent waiting for budget. (Later issue.)
//  2. Recoverer: turns a panic below it into an error that the outer
//     layers can see; Watermill's router recovers panics itself, so this is
//     only needed once outer layers care. (Later issue.)
//  3. Shedding: rejects work before it queues when the budget has been
//     saturated for too long; it must sit outside the budget to see
//     pressure without adding to it. (Later issue.)
//  4. RetryGate: holds retries back while the budget is saturated; outside
//     the budget, so a retry never holds vertices while it sleeps. (Later
//     issue.)
//  5. Budget: admission against the vertex budget, innermost, so the
//     vertices are held exactly while the handler (and handler-level
//     middlewares) run. The router fills this slot with three parts: a
//     shutdown gate, the [middleware.Budget] itself, and an inner layer
//     that counts admitted work and tells the Kafka session tracker which
//     deliveries completed.
type Stack struct {
	Tracing   message.HandlerMiddleware
	Recoverer message.HandlerMiddleware
	Shedding  message.HandlerMiddleware
	RetryGate message.HandlerMiddleware
	Budget    []message.HandlerMiddleware
}

// Middlewares returns the present layers, outermost first, ready for
// message.Router.AddMiddleware (the first added is the outermost).
func (s Stack) Middlewares() []message.HandlerMiddleware {
	var out []message.HandlerMiddleware
	for _, m := range []message.HandlerMiddleware{s.Tracing, s.Recoverer, s.Shedding, s.RetryGate} {
		if m != nil {
			out = append(out, m)
		}
	}
	for _, m := range s.Budget {
		if m != nil {
			out = append(out, m)
		}
	}
	return out
}

// Layers returns the names of the present layers, outermost first.
func (s Stack) Layers() []string {
	var out []string
	for _, l := range []struct {
		name string
		m    message.HandlerMiddleware
	}{{"tracing", s.Tracing}, {"recoverer", s.Recoverer}, {"shedding", s.Shedding}, {"retry-gate", s.RetryGate}} {
		if l.m != nil {
			out = append(out, l.name)
		}
	}
	if len(s.Budget) > 0 {
		out = append(out, "budget")
	}
	return out
}

// stack builds the router's stack. Later issues fill the other slots here.
func (r *Router) stack() Stack {
	s := Stack{}
	if r.budgetMW == nil {
		// Control configuration (tests only): no admission at all, but the
		// shutdown gate and in-flight accounting stay.
		s.Budget = []message.HandlerMiddleware{r.gate, r.admitted}
		return s
	}
	s.Budget = []message.HandlerMiddleware{r.gate, r.budgetMW.Middleware, r.admitted}
	return s
}

type origCtxKey struct{}

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
		if r.closingCtx.Err() != nil {
			<-orig.Done()
			return nil, orig.Err()
		}
		if t := r.tracker(message.HandlerNameFromCtx(orig)); t != nil {
			t.Begin(msg)
		}
		r.entered.Add(1)
		defer r.entered.Add(-1)
		ctx, cancel := context.WithCancel(context.WithValue(orig, origCtxKey{}, orig))
		stop := context.AfterFunc(r.closingCtx, cancel)
		defer func() {
			stop()
			cancel()
		}()
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
		if orig, ok := msg.Context().Value(origCtxKey{}).(context.Context); ok {
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
