package router

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/sizing"
)

// AdmissionHook is told how the vertex budget admitted each message
// (see [middleware.WithOnAdmission]): once per delivery attempt
// that reaches the budget, from the message's goroutine, after admission is
// decided and before the handler runs.
type AdmissionHook interface {
	OnAdmission(msg *message.Message, a middleware.Admission)
}

// ShedHook is told of every message the shedding policy drops (see
// [shedding.WithOnShed]): from the message's goroutine, after its audit
// copy is published and before it is acked. topic is the message's origin
// topic.
type ShedHook interface {
	OnShed(msg *message.Message, topic, reason string)
}

// RetryOutcomeHook is told how each delivery left the retry gate (see
// [retrygate.WithOnOutcome]): once per delivery, from the message's
// goroutine, before the gate's middleware returns. e.Message is the
// delivered message; neither e nor the message may be kept beyond the
// call.
type RetryOutcomeHook interface {
	OnRetryOutcome(e retrygate.Event)
}

// ResizeHook is told of each resize of the auto-sized budget (see
// [sizing.WithOnResize]): from the goroutine of the message
// whose completion triggered it, with the sizer's lock held, so it must
// not call the auto-sizer.
type ResizeHook interface {
	OnResize(from, to int64, b sizing.Bounds)
}

// WithHooks adds hooks that the router calls on its events. A hook
// implements one or more of [AdmissionHook], [ShedHook], [RetryOutcomeHook]
// and [ResizeHook]; the router calls it for the events whose interface it
// implements and for no other. *telemetry.Metrics is one: the router's own
// metrics are registered as the first hook, before those of WithHooks.
// An event calls every hook that implements its interface, in the order
// given (and in the order of the WithHooks options). Nil hooks are
// skipped; a hook that implements none of the interfaces makes [New] fail.
//
// Every hook method is called synchronously on the path of the event, so
// it must be fast, must not block and must be safe for concurrent use
// (events of different messages arrive from different goroutines). Each
// interface says which goroutine calls it.
func WithHooks(hooks ...any) Option {
	hooks = append([]any(nil), hooks...)
	return func(o *options) { o.hooks = append(o.hooks, hooks...) }
}

// hookSet is the dispatch of the router's hooks: per event, the hooks that
// implement its interface, in order. A nil func or an empty slice means
// no hook listens.
type hookSet struct {
	admission      []AdmissionHook // called in turn by Router.countAdmission
	onShed         func(*message.Message, string, string)
	onRetryOutcome func(retrygate.Event)
	onResize       func(from, to int64, b sizing.Bounds)
}

// newHookSet sorts hooks by the interfaces they implement. It fails on a
// hook that implements none, most likely a method name or signature that
// does not match.
func newHookSet(hooks []any) (hookSet, error) {
	var (
		adm    []AdmissionHook
		shed   []ShedHook
		retry  []RetryOutcomeHook
		resize []ResizeHook
	)
	for _, h := range hooks {
		if h == nil {
			continue
		}
		used := false
		if x, ok := h.(AdmissionHook); ok {
			adm, used = append(adm, x), true
		}
		if x, ok := h.(ShedHook); ok {
			shed, used = append(shed, x), true
		}
		if x, ok := h.(RetryOutcomeHook); ok {
			retry, used = append(retry, x), true
		}
		if x, ok := h.(ResizeHook); ok {
			resize, used = append(resize, x), true
		}
		if !used {
			return hookSet{}, fmt.Errorf("router: hook %T implements none of AdmissionHook, ShedHook, RetryOutcomeHook, ResizeHook", h)
		}
	}
	var s hookSet
	s.admission = adm
	switch len(shed) {
	case 0:
	case 1:
		s.onShed = shed[0].OnShed
	default:
		s.onShed = func(msg *message.Message, topic, r string) {
			for _, h := range shed {
				h.OnShed(msg, topic, r)
			}
		}
	}
	switch len(retry) {
	case 0:
	case 1:
		s.onRetryOutcome = retry[0].OnRetryOutcome
	default:
		s.onRetryOutcome = func(e retrygate.Event) {
			for _, h := range retry {
				h.OnRetryOutcome(e)
			}
		}
	}
	switch len(resize) {
	case 0:
	case 1:
		s.onResize = resize[0].OnResize
	default:
		s.onResize = func(from, to int64, b sizing.Bounds) {
			for _, h := range resize {
				h.OnResize(from, to, b)
			}
		}
	}
	return s, nil
}
