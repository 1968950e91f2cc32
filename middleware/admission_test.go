package middleware

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
)

// harness runs a real Watermill router on GoChannel with one handler behind
// the given middlewares.
type harness struct {
	t      *testing.T
	pubsub *gochannel.GoChannel
	router *message.Router
	done   chan struct{}
}

func newHarness(t *testing.T, h message.NoPublishHandlerFunc, mws ...message.HandlerMiddleware) *harness {
	t.Helper()
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(mws...)
	r.AddConsumerHandler("h", "in", ps, h)
	hs := &harness{t: t, pubsub: ps, router: r, done: make(chan struct{})}
	go func() {
		defer close(hs.done)
		if err := r.Run(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	<-r.Running()
	t.Cleanup(hs.close)
	return hs
}

func (h *harness) close() {
	_ = h.router.Close()
	<-h.done
	_ = h.pubsub.Close()
}

func (h *harness) publish(msgs ...*message.Message) {
	h.t.Helper()
	if err := h.pubsub.Publish("in", msgs...); err != nil {
		h.t.Fatal(err)
	}
}

func costed(id string, vertices int64) *message.Message {
	m := message.NewMessage(id, []byte("x"))
	m.Metadata.Set(cost.MetadataKey, strconv.FormatInt(vertices, 10))
	return m
}

func newAdmitter(t *testing.T, b *VertexBudget, opts ...Option) *Admitter {
	t.Helper()
	m, err := New(b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestNewRequiresBudget(t *testing.T) {
	_, err := New(nil)
	var fe *spillway.FieldError
	if !errors.Is(err, spillway.ErrInvalidConfig) || !errors.As(err, &fe) || fe.Field != "budget" {
		t.Fatalf("err = %v, want a FieldError on budget", err)
	}
}

// An option given to the constructor it does not belong to is an error
// that names it, not silently ignored; every problem is reported at once.
func TestMisplacedOptions(t *testing.T) {
	vb := mustVertexBudget(10)
	_, err := New(vb, WithLanes(Lane{Name: "a"}), WithMessageLimit(3), WithMaxVertices(-1))
	if !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Fatalf("New with budget options: err = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"WithLanes", "WithMessageLimit", "WithMaxVertices"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New: error %q does not name %s", err, want)
		}
	}
	_, err = NewVertexBudget(10, WithOnAdmission(func(*message.Message, Admission) {}), WithEstimator(nil))
	if !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Fatalf("NewVertexBudget with New's options: err = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"WithOnAdmission", "WithEstimator"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("NewVertexBudget: error %q does not name %s", err, want)
		}
	}
}

// Every charge is refunded when the handler fails; the message is nacked and
// redelivered, and InUse returns to zero.
func TestBudgetRefundsOnError(t *testing.T) {
	vb := mustVertexBudget(100)
	mw := newAdmitter(t, vb)
	var calls, done atomic.Int64
	h := newHarness(t, func(msg *message.Message) error {
		if vb.Stats().InUse == 0 {
			t.Error("handler ran without holding budget")
		}
		if calls.Add(1)%2 == 1 {
			return errors.New("transient")
		}
		done.Add(1)
		return nil
	}, mw.Middleware)
	for i := range 10 {
		h.publish(costed(strconv.Itoa(i), 10))
	}
	waitFor(t, "all messages to succeed", func() bool { return done.Load() == 10 })
	waitFor(t, "budget to drain", func() bool { return vb.Stats().InUse == 0 })
	if calls.Load() < 20 {
		t.Fatalf("calls = %d, want at least 20 (each fails once)", calls.Load())
	}
}

// A panicking handler is refunded too, whether Watermill's Recoverer turns
// the panic into an error inside the budget or the router recovers it.
func TestBudgetRefundsOnPanic(t *testing.T) {
	for _, withRecoverer := range []bool{false, true} {
		t.Run("recoverer="+strconv.FormatBool(withRecoverer), func(t *testing.T) {
			vb := mustVertexBudget(100)
			mw := newAdmitter(t, vb)
			mws := []message.HandlerMiddleware{mw.Middleware}
			if withRecoverer {
				mws = append(mws, wmw.Recoverer)
			}
			var calls, done atomic.Int64
			h := newHarness(t, func(msg *message.Message) error {
				if calls.Add(1) <= 3 {
					panic("boom")
				}
				done.Add(1)
				return nil
			}, mws...)
			h.publish(costed("a", 60))
			waitFor(t, "message to succeed after panics", func() bool { return done.Load() == 1 })
			waitFor(t, "budget to drain", func() bool { return vb.Stats().InUse == 0 })
			// With a leaked 60 the second message (60) could never fit.
			h.publish(costed("b", 60))
			waitFor(t, "second message", func() bool { return done.Load() == 2 })
		})
	}
}

// A message costlier than the whole budget is clamped and completes.
func TestBudgetClampInRouter(t *testing.T) {
	vb := mustVertexBudget(40_000)
	mw := newAdmitter(t, vb)
	var done atomic.Int64
	var clampedAlone atomic.Bool
	h := newHarness(t, func(msg *message.Message) error {
		if msg.UUID == "big" {
			clampedAlone.Store(vb.Stats().InUse == 40_000)
		}
		time.Sleep(time.Millisecond)
		done.Add(1)
		return nil
	}, mw.Middleware)
	h.publish(costed("s1", 5_000), costed("big", 41_000), costed("s2", 5_000))
	waitFor(t, "all three, including the oversized one", func() bool { return done.Load() == 3 })
	if !clampedAlone.Load() {
		t.Fatal("the clamped message did not hold the whole budget while it ran")
	}
	if s := vb.Stats(); s.Clamped != 1 || s.InUse != 0 {
		t.Fatalf("stats = %+v", s)
	}
}

// An unstamped message is charged the whole budget, never treated as cheap.
func TestBudgetMissingCostChargesCapacity(t *testing.T) {
	vb := mustVertexBudget(1_000)
	var got []Admission
	var mu sync.Mutex
	mw := newAdmitter(t, vb, WithOnAdmission(func(_ *message.Message, a Admission) {
		mu.Lock()
		got = append(got, a)
		mu.Unlock()
	}))
	var done atomic.Int64
	h := newHarness(t, func(msg *message.Message) error {
		done.Add(1)
		return nil
	}, mw.Middleware)
	bad := message.NewMessage("bad", []byte("x"))
	bad.Metadata.Set(cost.MetadataKey, "lots")
	h.publish(message.NewMessage("missing", []byte("x")), bad, costed("ok", 7))
	waitFor(t, "three messages", func() bool { return done.Load() == 3 })
	mu.Lock()
	defer mu.Unlock()
	bySource := map[cost.Source]Admission{}
	for _, a := range got {
		bySource[a.Charge.Source] = a
	}
	for _, src := range []cost.Source{cost.SourceMissing, cost.SourceMalformed} {
		a, ok := bySource[src]
		if !ok || a.Granted != 1_000 || a.Granted >= a.Charge.Vertices || a.Result != Admitted {
			t.Errorf("%v: admission = %+v, want the whole budget", src, a)
		}
	}
	if a := bySource[cost.SourceHeader]; a.Granted != 7 || a.Charge.Vertices != 7 {
		t.Errorf("header: admission = %+v", a)
	}
}

// 500 concurrent messages of mixed cost through a real router: the handlers
// never hold more than the capacity between them.
func TestBudgetBoundHeldInRouter(t *testing.T) {
	const capacity = 20_000
	vb := mustVertexBudget(capacity)
	mw := newAdmitter(t, vb)
	var inHandler, peak, done atomic.Int64
	h := newHarness(t, func(msg *message.Message) error {
		n, _ := strconv.ParseInt(msg.Metadata.Get(cost.MetadataKey), 10, 64)
		cur := inHandler.Add(n)
		for {
			p := peak.Load()
			if cur <= p || peak.CompareAndSwap(p, cur) {
				break
			}
		}
		time.Sleep(time.Duration(n%300) * time.Microsecond)
		inHandler.Add(-n)
		done.Add(1)
		return nil
	}, mw.Middleware)
	msgs := make([]*message.Message, 500)
	for i := range msgs {
		msgs[i] = costed(strconv.Itoa(i), int64(1+(i*7919)%4000))
	}
	h.publish(msgs...)
	waitFor(t, "500 messages", func() bool { return done.Load() == 500 })
	if p := peak.Load(); p > capacity {
		t.Fatalf("peak in handlers = %d > capacity %d", p, capacity)
	}
	if s := vb.Stats(); s.TotalWait == 0 {
		t.Fatalf("the bound was never exercised: %+v", s)
	}
}

// A message whose delivery is revoked while it waits steps aside: its
// handler never runs and it is acked, and the hook is told so.
func TestBudgetRevokedWhileWaiting(t *testing.T) {
	vb := mustVertexBudget(100)
	revoke := make(chan struct{})
	var (
		outcomes sync.Map
		tl       tally
	)
	mw := newAdmitter(t, vb,
		WithRevoked(func(msg *message.Message) <-chan struct{} {
			if msg.UUID == "waiter" {
				return revoke
			}
			return nil
		}),
		WithOnAdmission(func(msg *message.Message, a Admission) { outcomes.Store(msg.UUID, a.Result); tl.observe(msg, a) }),
	)
	release := make(chan struct{})
	var ran sync.Map
	h := newHarness(t, func(msg *message.Message) error {
		ran.Store(msg.UUID, true)
		if msg.UUID == "holder" {
			<-release
		}
		return nil
	}, mw.Middleware)
	h.publish(costed("holder", 100))
	waitFor(t, "holder admitted", func() bool { return vb.Stats().InUse == 100 })
	h.publish(costed("waiter", 10))
	waitFor(t, "waiter queued", func() bool { return vb.Stats().Waiting == 1 })
	close(revoke)
	waitFor(t, "waiter to step aside", func() bool { return tl.get(Revoked) == 1 })
	if vb.Stats().Waiting != 0 {
		t.Fatal("revoked waiter still queued")
	}
	close(release)
	waitFor(t, "holder done", func() bool { return vb.Stats().InUse == 0 })
	time.Sleep(50 * time.Millisecond) // a nack would be redelivered by now
	if _, ok := ran.Load("waiter"); ok {
		t.Fatal("revoked message's handler ran")
	}
	if o, _ := outcomes.Load("waiter"); o != Revoked {
		t.Fatalf("outcome = %v, want revoked", o)
	}
}

// A delivery already revoked when it reaches the budget never runs, even if
// the budget has room.
func TestBudgetRevokedBeforeAdmission(t *testing.T) {
	vb := mustVertexBudget(100)
	closed := make(chan struct{})
	close(closed)
	var tl tally
	mw := newAdmitter(t, vb, WithRevoked(func(*message.Message) <-chan struct{} { return closed }), WithOnAdmission(tl.observe))
	var ran atomic.Int64
	h := newHarness(t, func(*message.Message) error { ran.Add(1); return nil }, mw.Middleware)
	h.publish(costed("a", 1))
	waitFor(t, "step aside", func() bool { return tl.get(Revoked) == 1 })
	if ran.Load() != 0 {
		t.Fatal("handler ran for a revoked delivery")
	}
}

// When the message context ends while waiting (router shutdown), the handler
// does not run, nothing is held, and the message is nacked, not acked.
func TestBudgetCancelledOnClose(t *testing.T) {
	vb := mustVertexBudget(100)
	var tl tally
	mw := newAdmitter(t, vb, WithOnAdmission(tl.observe))
	release := make(chan struct{})
	var ran sync.Map
	waiterErr := make(chan error, 1)
	// The outermost middleware sees what the router will do: a nil error
	// acks, any other nacks.
	observe := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if msg.UUID == "waiter" {
				select {
				case waiterErr <- err: // the first delivery's verdict
				default:
				}
			}
			return out, err
		}
	}
	h := newHarness(t, func(msg *message.Message) error {
		ran.Store(msg.UUID, true)
		if msg.UUID == "holder" {
			<-release
		}
		return nil
	}, observe, mw.Middleware)
	waiter := costed("waiter", 50)
	h.publish(costed("holder", 100))
	waitFor(t, "holder admitted", func() bool { return vb.Stats().InUse == 100 })
	h.publish(waiter)
	waitFor(t, "waiter queued", func() bool { return vb.Stats().Waiting == 1 })

	closed := make(chan struct{})
	go func() { h.close(); close(closed) }()
	// GoChannel resends a nacked message until its subscriber is closed, so
	// the waiter may be delivered (and cancelled) again during shutdown.
	waitFor(t, "waiter to give up", func() bool { return tl.get(Cancelled) >= 1 })
	if _, ok := ran.Load("waiter"); ok {
		t.Fatal("handler ran for a message cancelled while waiting")
	}
	if err := <-waiterErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter returned %v, want context.Canceled (a nack)", err)
	}
	close(release)
	<-closed
	if s := vb.Stats(); s.InUse != 0 || s.Waiting != 0 || vb.cancelled < 1 {
		t.Fatalf("stats = %+v", s)
	}
}

// tally counts admissions by result; its observe is an OnAdmission hook.
type tally struct {
	mu sync.Mutex
	n  map[AdmissionResult]int64
}

func (t *tally) observe(_ *message.Message, a Admission) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == nil {
		t.n = map[AdmissionResult]int64{}
	}
	t.n[a.Result]++
}

func (t *tally) get(o AdmissionResult) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n[o]
}
