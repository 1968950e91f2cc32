package router

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/sizing"
)

// The interfaces a hook of [WithHooks] implements, one per event. They
// are unexported: a hook is any value with one or more of these methods,
// and users name the methods, not the interfaces.
type (
	// admissionHook is told how the vertex budget admitted each message
	// (see [middleware.WithOnAdmission]).
	admissionHook interface {
		OnAdmission(msg *message.Message, a middleware.Admission)
	}
	// shedHook is told of every message the shedding policy drops (see
	// [shedding.WithOnShed]).
	shedHook interface {
		OnShed(msg *message.Message, topic, reason string)
	}
	// retryOutcomeHook is told how each delivery left the retry gate (see
	// [retrygate.WithOnOutcome]).
	retryOutcomeHook interface {
		OnRetryOutcome(e retrygate.Event)
	}
	// resizeHook is told of each resize of the auto-sized budget (see
	// [sizing.WithOnResize]).
	resizeHook interface {
		OnResize(from, to int64, b sizing.Bounds)
	}
)

// WithHooks adds hooks that the router calls on its events. A hook is any
// value with one or more of these methods; the router calls each method
// on its event and nothing else:
//
//   - OnAdmission(msg *message.Message, a middleware.Admission): once per
//     delivery attempt that reaches the vertex budget, from the message's
//     goroutine, after admission is decided and before the handler runs.
//   - OnShed(msg *message.Message, topic, reason string): for every message
//     the shedding policy drops, from the message's goroutine, after its
//     audit copy is published and before it is acked; topic is the
//     message's origin topic.
//   - OnRetryOutcome(e retrygate.Event): once per delivery leaving the
//     retry gate, from the message's goroutine; neither e nor e.Message may
//     be kept beyond the call.
//   - OnResize(from, to int64, b sizing.Bounds): after each resize of
//     the auto-sized budget, from the goroutine of the message whose
//     completion triggered it, with the sizer's lock held, so it must not
//     call the auto-sizer.
//
// *telemetry.Metrics has the first three: the router's own metrics are
// registered as the first hook, before those of WithHooks. An event calls
// every hook that has its method, in the order given (and in the order of
// the WithHooks options). Nil hooks are skipped; a hook with none of the
// methods (a misspelt name, a different signature) makes [New] fail.
//
// Every hook method is called synchronously on the path of the event, so
// it must be fast, must not block and must be safe for concurrent use
// (events of different messages arrive from different goroutines).
func WithHooks(hooks ...any) Option {
	hooks = append([]any(nil), hooks...)
	return func(o *options) { o.hooks = append(o.hooks, hooks...) }
}

// hookSet is the dispatch of the router's hooks: per event, the hooks that
// implement its interface, in order. A nil func or an empty slice means
// no hook listens.
type hookSet struct {
	admission      []admissionHook // called in turn by Router.countAdmission
	onShed         func(*message.Message, string, string)
	onRetryOutcome func(retrygate.Event)
	onResize       func(from, to int64, b sizing.Bounds)
}

// newHookSet sorts hooks by the methods they have. It fails on a hook
// that has none, most likely a method name or signature that
// does not match.
func newHookSet(hooks []any) (hookSet, error) {
	var (
		adm    []admissionHook
		shed   []shedHook
		retry  []retryOutcomeHook
		resize []resizeHook
	)
	for _, h := range hooks {
		if h == nil {
			continue
		}
		used := false
		if x, ok := h.(admissionHook); ok {
			adm, used = append(adm, x), true
		}
		if x, ok := h.(shedHook); ok {
			shed, used = append(shed, x), true
		}
		if x, ok := h.(retryOutcomeHook); ok {
			retry, used = append(retry, x), true
		}
		if x, ok := h.(resizeHook); ok {
			resize, used = append(resize, x), true
		}
		if !used {
			return hookSet{}, fmt.Errorf("router: hook %T has none of the hook methods OnAdmission, OnShed, OnRetryOutcome, OnResize (check their names and signatures)", h)
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
