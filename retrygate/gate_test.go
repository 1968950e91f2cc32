package retrygate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/cenkalti/backoff/v5"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
)

func mustNew(t *testing.T, pub message.Publisher, cfg Config, opts ...Option) *Gate {
	t.Helper()
	g, err := New(pub, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// failFirst returns a handler that fails the first n attempts of every
// message, and counts its runs.
func failFirst(n int, runs *atomic.Int64) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		if AttemptFromCtx(msg.Context()) <= n {
			return nil, errTransient
		}
		return nil, nil
	}
}

func newMsg(id string) *message.Message { return message.NewMessage(id, []byte("x")) }

func lastEvent(t *testing.T, ev *events) Event {
	t.Helper()
	all := ev.all()
	if len(all) == 0 {
		t.Fatal("no event")
	}
	return all[len(all)-1]
}

// Backoff stops the moment the message context ends; the message is nacked
// with the context's error and nothing is published.
func TestBackoffStopsWhenContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pub := newRecPub(nil)
		ev := &events{}
		cfg := noJitter()
		cfg.InitialInterval, cfg.MaxInterval = time.Hour, time.Hour
		cfg.MaxElapsedTime = 10 * time.Hour
		g := mustNew(t, pub, cfg, WithOnOutcome(ev.add))

		ctx, cancel := context.WithCancel(context.Background())
		msg := newMsg("c")
		msg.SetContext(ctx)
		var runs atomic.Int64
		errc := make(chan error, 1)
		start := time.Now()
		go func() { errc <- call(g.Middleware, failFirst(100, &runs), msg) }()
		synctest.Wait() // failed once, now waiting an hour
		time.Sleep(time.Minute)
		cancel()
		err := <-errc
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if d := time.Since(start); d != time.Minute {
			t.Fatalf("returned after %v, want at once on cancel (1m)", d)
		}
		if runs.Load() != 1 || pub.n.Load() != 0 {
			t.Fatalf("runs = %d, publishes = %d; want 1, 0", runs.Load(), pub.n.Load())
		}
		if e := lastEvent(t, ev); e.Outcome != Nacked || e.Cause != causeContextDone {
			t.Fatalf("event = %v/%v, want nacked/context_done", e.Outcome, e.Cause)
		}
		if e := lastEvent(t, ev); e.Message != msg || ev.lastContext() != ctx {
			t.Fatal("the event does not carry the delivered message with its delivery context")
		}
		if msg.Context() != ctx {
			t.Fatal("message context not restored")
		}
	})
}

// An exhausted retry budget defers instead of retrying; once it refills,
// failures are retried in process again.
func TestRetryBudgetExhaustedDefersThenRefills(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pub := newRecPub(nil)
		ev := &events{}
		cfg := noJitter()
		cfg.InitialInterval = 10 * time.Millisecond
		cfg.RetryRate, cfg.RetryBurst, cfg.RetryRatio = 1, 1, spillway.Off
		g := mustNew(t, pub, cfg, WithOnOutcome(ev.add))
		var runs atomic.Int64
		h := failFirst(1, &runs)

		if err := call(g.Middleware, h, newMsg("a")); err != nil {
			t.Fatal(err)
		}
		if e := lastEvent(t, ev); e.Outcome != Handled || e.retries != 1 {
			t.Fatalf("a: %v after %d retries, want handled after 1 (the one token)", e.Outcome, e.retries)
		}

		if err := call(g.Middleware, h, newMsg("b")); err != nil {
			t.Fatal(err)
		}
		e := lastEvent(t, ev)
		if e.Outcome != Deferred || e.Cause != causeRetryBudget || e.retries != 0 || e.destination != "retry" {
			t.Fatalf("b: %+v, want deferred for lack of a token", e)
		}
		if got := pub.on("retry"); len(got) != 1 || got[0].Metadata.Get(attemptKey) != "1" {
			t.Fatalf("retry topic = %v, want b with attempt 1", got)
		}
		if st := g.Stats(); g.counts.snapshot().budgetDenied != 1 || st.RetryTokens >= 1 {
			t.Fatalf("stats = %+v, want 1 denial and an empty bucket", st)
		}

		time.Sleep(time.Second) // refill one token
		if err := call(g.Middleware, h, newMsg("c")); err != nil {
			t.Fatal(err)
		}
		if e := lastEvent(t, ev); e.Outcome != Handled || e.retries != 1 {
			t.Fatalf("c: %v after %d retries, want handled after 1", e.Outcome, e.retries)
		}
		if runs.Load() != 5 {
			t.Fatalf("runs = %d, want 5", runs.Load())
		}
	})
}

// Fresh messages earn RetryRatio tokens each, capped at RetryBurst;
// redelivered messages earn none and spend one to run.
func TestRetryRatioEarnsTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pub := newRecPub(nil)
		ev := &events{}
		cfg := noJitter()
		cfg.RetryRate, cfg.RetryBurst, cfg.RetryRatio = spillway.Off, 2, 0.5
		g := mustNew(t, pub, cfg, WithOnOutcome(ev.add))
		var runs atomic.Int64
		ok := failFirst(0, &runs)
		once := failFirst(1, &runs)

		_ = call(g.Middleware, once, newMsg("a")) // earns 0.5, cannot retry
		if e := lastEvent(t, ev); e.Cause != causeRetryBudget {
			t.Fatalf("a: %v, want deferred for the budget", e.Cause)
		}
		for i := range 10 { // earn 5, capped at 2
			_ = call(g.Middleware, ok, newMsg("ok"+strconv.Itoa(i)))
		}
		if tok := g.Stats().RetryTokens; tok != 2 {
			t.Fatalf("tokens = %v, want 2 (the burst cap)", tok)
		}
		red := newMsg("r")
		red.Metadata.Set(attemptKey, "1") // redelivered: spends a token to run
		_ = call(g.Middleware, ok, red)
		if tok := g.Stats().RetryTokens; tok != 1 {
			t.Fatalf("tokens = %v after a redelivery, want 1", tok)
		}
		_ = call(g.Middleware, once, newMsg("b")) // earns 0.5, spends 1
		if e := lastEvent(t, ev); e.Outcome != Handled || e.retries != 1 {
			t.Fatalf("b: %+v, want handled after 1 retry", e)
		}
		if tok := g.Stats().RetryTokens; tok != 0.5 {
			t.Fatalf("tokens = %v, want 0.5", tok)
		}
	})
}

// A redelivered message that arrives while saturated is deferred before its
// handler runs; a fresh one under the same pressure still runs.
func TestRedeliveredShedOnArrival(t *testing.T) {
	for _, mode := range []DeferMode{DeferRepublish, DeferNack} {
		t.Run(string(mode), func(t *testing.T) {
			pub := newRecPub(nil)
			ev := &events{}
			cfg := noJitter()
			cfg.Defer = mode
			sp := &switchPressure{}
			sp.on.Store(true)
			g := mustNew(t, pub, cfg, WithPressure(sp), WithOnOutcome(ev.add), WithRedelivery(func(m *message.Message) bool { return m.Metadata.Get("broker_redelivered") == "yes" }))
			var runs atomic.Int64
			h := failFirst(0, &runs)

			byAttempt := newMsg("a")
			byAttempt.Metadata.Set(attemptKey, "2")
			byHook := newMsg("b")
			byHook.Metadata.Set("broker_redelivered", "yes")
			for _, m := range []*message.Message{byAttempt, byHook} {
				err := call(g.Middleware, h, m)
				if mode == DeferNack && !errors.Is(err, errDeferred) {
					t.Fatalf("%s: err = %v, want errDeferred", m.UUID, err)
				}
				if mode == DeferRepublish && err != nil {
					t.Fatalf("%s: err = %v", m.UUID, err)
				}
				e := lastEvent(t, ev)
				if e.Outcome != Deferred || e.Cause != causeSaturatedOnArrival || !e.redelivered {
					t.Fatalf("%s: %+v, want deferred on arrival", m.UUID, e)
				}
			}
			if runs.Load() != 0 {
				t.Fatalf("handler ran %d times for redelivered work under saturation", runs.Load())
			}
			if err := call(g.Middleware, h, newMsg("fresh")); err != nil {
				t.Fatal(err)
			}
			if runs.Load() != 1 || lastEvent(t, ev).Outcome != Handled {
				t.Fatal("fresh message did not run under saturation")
			}
			st := g.counts.snapshot()
			if st.onArrival != 2 || st.deferred != 2 || st.handled != 1 {
				t.Fatalf("stats = %+v", st)
			}
			wantPub := 2
			if mode == DeferNack {
				wantPub = 0
				// Best effort: the counts are written to the delivered
				// message, for subscribers that resend it.
				if got := byAttempt.Metadata.Get(deferralsKey); got != "1" {
					t.Fatalf("deferrals on nacked message = %q, want 1", got)
				}
			}
			if got := len(pub.on("retry")); got != wantPub {
				t.Fatalf("%d retry publishes, want %d", got, wantPub)
			}
		})
	}
}

// With DeferNack a failure under saturation is nacked at once with an error
// that wraps both errDeferred and the handler's error.
func TestDeferNackWrapsHandlerError(t *testing.T) {
	pub := newRecPub(nil)
	cfg := noJitter()
	cfg.Defer = DeferNack
	sp := &switchPressure{}
	sp.on.Store(true)
	g := mustNew(t, pub, cfg, WithPressure(sp))
	var runs atomic.Int64
	msg := newMsg("n")
	err := call(g.Middleware, failFirst(5, &runs), msg)
	if !errors.Is(err, errDeferred) || !errors.Is(err, errTransient) {
		t.Fatalf("err = %v, want errDeferred wrapping the handler error", err)
	}
	if msg.Metadata.Get(attemptKey) != "1" || pub.n.Load() != 0 {
		t.Fatalf("attempt = %q, publishes = %d", msg.Metadata.Get(attemptKey), pub.n.Load())
	}
}

// Failing to publish to the retry topic nacks the message instead of
// dropping it.
func TestRetryPublishFailureNacks(t *testing.T) {
	pub := newRecPub(nil)
	pub.setFail(func(string) bool { return true })
	ev := &events{}
	sp := &switchPressure{}
	sp.on.Store(true)
	g := mustNew(t, pub, noJitter(), WithPressure(sp), WithOnOutcome(ev.add))
	var runs atomic.Int64
	err := call(g.Middleware, failFirst(5, &runs), newMsg("p"))
	if !errors.Is(err, errPublish) {
		t.Fatalf("err = %v, want the publish error", err)
	}
	if e := lastEvent(t, ev); e.Outcome != Nacked || e.Cause != causePublishFailed {
		t.Fatalf("event = %+v", e)
	}
}

// A deferred message that arrives early is held until it is due, at most
// min(2 × MaxInterval, MaxElapsedTime); it holds nothing else meanwhile.
func TestNotBeforeHoldsEarlyArrivals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, newRecPub(nil), noJitter())
		var runs atomic.Int64
		for _, tc := range []struct {
			due, want time.Duration
		}{
			{3 * time.Second, 3 * time.Second},
			{-time.Second, 0},
			{10 * time.Hour, 2 * time.Minute}, // capped: 2 × MaxInterval
		} {
			m := newMsg("due")
			m.Metadata.Set(attemptKey, "1")
			m.Metadata.Set(notBeforeKey, time.Now().Add(tc.due).UTC().Format(time.RFC3339Nano))
			start := time.Now()
			if err := call(g.Middleware, failFirst(0, &runs), m); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d != tc.want {
				t.Errorf("due in %v: held %v, want %v", tc.due, d, tc.want)
			}
		}
		bad := newMsg("bad")
		bad.Metadata.Set(notBeforeKey, "not a time")
		start := time.Now()
		if err := call(g.Middleware, failFirst(0, &runs), bad); err != nil || time.Since(start) != 0 {
			t.Fatalf("malformed due time: err %v, held %v", err, time.Since(start))
		}
	})
}

// A retry whose wait would end past MaxElapsedTime is deferred instead.
func TestMaxElapsedTimeDefers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pub := newRecPub(nil)
		ev := &events{}
		cfg := noJitter()
		cfg.MaxElapsedTime = 2 * time.Second
		g := mustNew(t, pub, cfg, WithOnOutcome(ev.add))
		var runs atomic.Int64
		if err := call(g.Middleware, failFirst(10, &runs), newMsg("m")); err != nil {
			t.Fatal(err)
		}
		// Attempt 1 fails at 0s, waits 1s; attempt 2 fails at 1s and the
		// next wait (2s) would end at 3s > 2s.
		e := lastEvent(t, ev)
		if e.Outcome != Deferred || e.Cause != causeMaxElapsed || e.attempts != 2 || e.elapsed != time.Second {
			t.Fatalf("event = %+v", e)
		}
		r := pub.on("retry")[0]
		if r.Metadata.Get(notBeforeKey) != time.Now().Add(2*time.Second).UTC().Format(time.RFC3339Nano) {
			t.Fatalf("due = %s, want now + the 2s wait", r.Metadata.Get(notBeforeKey))
		}
	})
}

// SaturatedAfter ignores saturation shorter than the threshold.
func TestSaturatedAfterThreshold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sat atomic.Int64
		cfg := noJitter()
		cfg.SaturatedAfter = 100 * time.Millisecond
		ev := &events{}
		g := mustNew(t, newRecPub(nil), cfg, WithPressure(spillway.PressureFunc(func() time.Duration { return time.Duration(sat.Load()) })), WithOnOutcome(ev.add))
		var runs atomic.Int64
		sat.Store(int64(50 * time.Millisecond))
		_ = call(g.Middleware, failFirst(1, &runs), newMsg("short"))
		if e := lastEvent(t, ev); e.Outcome != Handled || e.retries != 1 {
			t.Fatalf("short saturation: %+v, want retried in process", e)
		}
		sat.Store(int64(100 * time.Millisecond))
		_ = call(g.Middleware, failFirst(1, &runs), newMsg("long"))
		if e := lastEvent(t, ev); e.Outcome != Deferred || e.Cause != causeSaturated {
			t.Fatalf("sustained saturation: %+v, want deferred", e)
		}
	})
}

// Every attempt starts from the context the message arrived with, so an
// inner middleware that cancels its own context (Watermill's Timeout) does
// not doom the retry; the handler sees the attempt number.
func TestContextResetBetweenAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, newRecPub(nil), noJitter())
		var seen []int
		h := func(msg *message.Message) ([]*message.Message, error) {
			if err := msg.Context().Err(); err != nil {
				return nil, fmt.Errorf("attempt started with a dead context: %w", err)
			}
			seen = append(seen, AttemptFromCtx(msg.Context()))
			if len(seen) < 3 {
				return nil, errTransient
			}
			return []*message.Message{newMsg("out")}, nil
		}
		ctx := context.WithValue(context.Background(), struct{ k int }{1}, "v")
		msg := newMsg("m")
		msg.SetContext(ctx)
		out, err := g.Middleware(wmw.Timeout(time.Minute)(h))(msg)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 1 || out[0].UUID != "out" {
			t.Fatalf("produced = %v, want the handler's messages", out)
		}
		if fmt.Sprint(seen) != "[1 2 3]" {
			t.Fatalf("attempts seen = %v, want [1 2 3]", seen)
		}
		if msg.Context() != ctx {
			t.Fatal("message context not restored")
		}
		if AttemptFromCtx(context.Background()) != 0 {
			t.Fatal("AttemptFromCtx outside a gate should be 0")
		}
	})
}

// A panic is counted as nacked and passed on unchanged.
func TestPanicCountedAndPassedOn(t *testing.T) {
	ev := &events{}
	g := mustNew(t, newRecPub(nil), noJitter(), WithOnOutcome(ev.add))
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		_ = call(g.Middleware, func(*message.Message) ([]*message.Message, error) { panic("boom") }, newMsg("p"))
	}()
	if e := lastEvent(t, ev); e.Outcome != Nacked || e.Cause != causePanic {
		t.Fatalf("event = %+v", e)
	}
	if st := g.Stats(); st.Nacked != 1 || st.deliveries() != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

// Garbage attempt metadata is treated as a fresh message.
func TestMalformedAttemptMetadata(t *testing.T) {
	ev := &events{}
	g := mustNew(t, newRecPub(nil), noJitter(), WithOnOutcome(ev.add))
	for _, v := range []string{"", "-3", "x", "1e3"} {
		m := newMsg("m")
		m.Metadata.Set(attemptKey, v)
		var runs atomic.Int64
		_ = call(g.Middleware, failFirst(0, &runs), m)
		if e := lastEvent(t, ev); e.redelivered || e.attempts != 1 {
			t.Fatalf("attempt %q: %+v, want a fresh first attempt", v, e)
		}
	}
}

func TestIsPermanent(t *testing.T) {
	_, decodeErr := cost.Decode([]byte{0x01, 0x02})
	cases := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errTransient, false},
		{context.DeadlineExceeded, false},
		{Permanent(errTransient), true},
		{fmt.Errorf("wrapped: %w", Permanent(errTransient)), true},
		{backoff.Permanent(errTransient), true},
		{decodeErr, true},
		{fmt.Errorf("handler: %w", cost.ErrMalformed), true},
		{cost.ErrMalformed, true},
		{cost.ErrTooLarge, true},
	}
	for _, c := range cases {
		if got := IsPermanent(c.err); got != c.want {
			t.Errorf("IsPermanent(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if Permanent(nil) != nil {
		t.Error("Permanent(nil) != nil")
	}
	p := Permanent(errTransient)
	if !errors.Is(p, errTransient) || p.Error() != errTransient.Error() {
		t.Error("Permanent hides the error it marks")
	}
}

// A custom classifier replaces the default.
func TestCustomIsPermanent(t *testing.T) {
	pub := newRecPub(nil)
	g := mustNew(t, pub, noJitter(), WithIsPermanent(func(err error) bool { return errors.Is(err, errTransient) }))
	var runs atomic.Int64
	_ = call(g.Middleware, failFirst(1, &runs), newMsg("c"))
	if runs.Load() != 1 || len(pub.on("dlq")) != 1 {
		t.Fatalf("runs = %d, dead letters = %d; want 1, 1", runs.Load(), len(pub.on("dlq")))
	}
}

// context.Canceled from below the gate, once the message context has been
// cancelled, is abandoned work, not a failure: the message is nacked at
// once, neither retried nor dead-lettered. (With the message context alive
// it is a failure: TestEdgeWrappedCanceledIsAFailure.)
func TestCanceledBelowGateNacks(t *testing.T) {
	pub := newRecPub(nil)
	ev := &events{}
	g := mustNew(t, pub, noJitter(), WithOnOutcome(ev.add))
	var runs atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	msg := newMsg("c")
	msg.SetContext(ctx)
	err := call(g.Middleware, func(*message.Message) ([]*message.Message, error) {
		runs.Add(1)
		cancel() // shutdown: the delivery ends while the handler waits
		return nil, fmt.Errorf("waiting for budget: %w", context.Canceled)
	}, msg)
	if !errors.Is(err, context.Canceled) || runs.Load() != 1 || pub.n.Load() != 0 {
		t.Fatalf("err = %v, runs = %d, publishes = %d", err, runs.Load(), pub.n.Load())
	}
	if e := lastEvent(t, ev); e.Outcome != Nacked || e.Cause != causeContextDone {
		t.Fatalf("event = %+v", e)
	}
}

// A delivery revoked while it waits in the gate (its Kafka session ended,
// a peer claimed its Redis entry) stops waiting at once, is acked without
// running the handler again, and is recorded deferred, cause "revoked":
// both in the backoff before a retry and while a redelivery is held until
// its due time. The channel is asked for only when a message waits.
func TestRevokedWaitStepsAside(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pub := newRecPub(nil)
		ev := &events{}
		cfg := noJitter()
		cfg.InitialInterval, cfg.MaxInterval = time.Hour, time.Hour
		cfg.MaxElapsedTime = 10 * time.Hour
		revoke := make(chan struct{})
		var asked atomic.Int64
		g := mustNew(t, pub, cfg, WithOnOutcome(ev.add), WithRevoked(func(*message.Message) <-chan struct{} { asked.Add(1); return revoke }))

		// Handled at once: no wait, no question.
		var runs atomic.Int64
		if err := call(g.Middleware, failFirst(0, &runs), newMsg("ok")); err != nil || asked.Load() != 0 {
			t.Fatalf("a handled message: err %v, Revoked asked %d times", err, asked.Load())
		}

		for _, tc := range []struct {
			name string
			msg  func() *message.Message
			runs int64
		}{
			{"backoff", func() *message.Message { return newMsg("b") }, 1},
			{"held until due", func() *message.Message {
				m := newMsg("h")
				m.Metadata.Set(attemptKey, "1")
				m.Metadata.Set(notBeforeKey, time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano))
				return m
			}, 0},
		} {
			revoke = make(chan struct{})
			runs.Store(0)
			msg := tc.msg()
			errc := make(chan error, 1)
			start := time.Now()
			go func() { errc <- call(g.Middleware, failFirst(100, &runs), msg) }()
			synctest.Wait() // waiting in the gate
			time.Sleep(time.Minute)
			close(revoke)
			if err := <-errc; err != nil {
				t.Fatalf("%s: err = %v, want an ack (nil)", tc.name, err)
			}
			if d := time.Since(start); d != time.Minute {
				t.Errorf("%s: returned after %v, want at once on revocation (1m)", tc.name, d)
			}
			if runs.Load() != tc.runs || pub.n.Load() != 0 {
				t.Errorf("%s: runs = %d, publishes = %d; want %d, 0", tc.name, runs.Load(), pub.n.Load(), tc.runs)
			}
			if e := lastEvent(t, ev); e.Outcome != Deferred || e.Cause != causeRevoked || e.Message != msg {
				t.Errorf("%s: event = %v/%v, want deferred/revoked", tc.name, e.Outcome, e.Cause)
			}
		}

		if st := g.Stats(); st.Revoked != 2 || st.Deferred != 2 {
			t.Errorf("stats: revoked %d, deferred %d; want 2 and 2", st.Revoked, st.Deferred)
		}

		// Revoked before the wait begins: no wait at all.
		start := time.Now()
		if err := call(g.Middleware, failFirst(100, &runs), newMsg("late")); err != nil || time.Since(start) != 0 {
			t.Fatalf("already revoked: err %v, waited %v", err, time.Since(start))
		}
	})
}
