package retrygate

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
)

func costed(id string, vertices int64) *message.Message {
	m := message.NewMessage(id, []byte("payload"))
	m.Metadata.Set(cost.MetadataKey, strconv.FormatInt(vertices, 10))
	return m
}

// The gate sits outside the budget: while a failed message waits for its
// next attempt it holds no vertices, and each attempt is admitted and
// refunded on its own.
func TestBudgetNotHeldDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		vb := mustVertexBudget(100)
		bm, err := middleware.New(vb)
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int64
		rg := newRig(t, noJitter(), []Option{WithPressure(vb)}, func(msg *message.Message) error {
			if got := vb.Stats().InUse; got != 40 {
				t.Errorf("attempt %d ran holding %d vertices, want 40", AttemptFromCtx(msg.Context()), got)
			}
			if calls.Add(1) < 3 {
				return errTransient
			}
			return nil
		}, layers{inner: []message.HandlerMiddleware{bm.Middleware}})
		defer rg.close()

		start := time.Now()
		rg.publish(costed("m", 40))
		synctest.Wait()
		check := func(wantCalls int64) {
			t.Helper()
			if got := calls.Load(); got != wantCalls {
				t.Fatalf("at %v: calls = %d, want %d", time.Since(start), got, wantCalls)
			}
			if got := vb.Stats().InUse; got != 0 {
				t.Fatalf("at %v: InUse = %d during backoff, want 0", time.Since(start), got)
			}
		}
		check(1) // first attempt failed; waiting 1s
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		check(1)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		check(2) // second attempt failed; waiting 2s
		time.Sleep(2 * time.Second)
		synctest.Wait()
		check(3)
		st := rg.gate.Stats()
		if st.Handled != 1 || st.Retries != 2 || st.deliveries() != 1 {
			t.Fatalf("stats = %+v, want 1 handled after 2 retries", st)
		}
		if s := vb.Stats(); s.Admitted != 3 {
			t.Fatalf("budget admitted %d charges, want 3 (one per attempt)", s.Admitted)
		}
	})
}

// Under saturation a failing message is deferred at once, without waiting
// a backoff interval, and fresh messages keep flowing. A redelivered
// message that arrives while still saturated is deferred again without
// running its handler; once the pressure is gone it runs and succeeds.
func TestSaturationDefersWhileFreshFlows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp := &switchPressure{}
		sp.on.Store(true)
		var mu sync.Mutex
		runs := map[string][]int{} // uuid -> attempts seen
		cfg := Config{InitialInterval: time.Second, MaxInterval: time.Minute, Jitter: spillway.Off}
		rg := newRig(t, cfg, []Option{WithPressure(sp)}, func(msg *message.Message) error {
			a := AttemptFromCtx(msg.Context())
			mu.Lock()
			runs[msg.UUID] = append(runs[msg.UUID], a)
			mu.Unlock()
			if msg.UUID == "bad" && a == 1 {
				return errTransient
			}
			return nil
		}, layers{})
		defer rg.close()

		start := time.Now()
		rg.publish(message.NewMessage("bad", []byte("x")))
		for i := range 20 {
			rg.publish(message.NewMessage("fresh-"+strconv.Itoa(i), []byte("x")))
		}
		synctest.Wait()

		if d := time.Since(start); d != 0 {
			t.Fatalf("deferral took %v of backoff, want none", d)
		}
		st := rg.gate.Stats()
		if in := rg.gate.counts.topic("in"); in.handled != 20 || in.deferred != 1 || st.Retries != 0 {
			t.Fatalf("topic in: %+v, want 20 handled, 1 deferred, no retries", in)
		}
		retries := rg.pub.on("in.retry")
		if len(retries) != 1 {
			t.Fatalf("%d messages on in.retry, want 1", len(retries))
		}
		r := retries[0]
		wantMeta := map[string]string{
			attemptKey:     "1",
			deferralsKey:   "1",
			OriginTopicKey: "in",
			lastErrorKey:   errTransient.Error(),
			notBeforeKey:   start.Add(time.Second).UTC().Format(time.RFC3339Nano),
		}
		for k, v := range wantMeta {
			if got := r.Metadata.Get(k); got != v {
				t.Errorf("retry copy %s = %q, want %q", k, got, v)
			}
		}
		if r.UUID != "bad" {
			t.Errorf("retry copy UUID = %q, want the original's", r.UUID)
		}

		// The copy is due after 1s. Still saturated: it is shed on
		// arrival, without running the handler.
		time.Sleep(time.Second)
		synctest.Wait()
		st = rg.gate.Stats()
		if c := rg.gate.counts.topic("in.retry"); c.deferred != 1 || c.onArrival != 1 || c.handled != 0 {
			t.Fatalf("topic in.retry: %+v, want 1 deferred on arrival", c)
		}
		mu.Lock()
		if got := len(runs["bad"]); got != 1 {
			t.Fatalf("handler ran %d times for bad while saturated, want 1", got)
		}
		mu.Unlock()
		if got := rg.pub.on("in.retry")[1].Metadata.Get(deferralsKey); got != "2" {
			t.Fatalf("second deferral count = %q, want 2", got)
		}

		// Pressure gone: the next redelivery (due 4s later) runs attempt 2.
		sp.on.Store(false)
		time.Sleep(4 * time.Second)
		synctest.Wait()
		mu.Lock()
		if got := runs["bad"]; len(got) != 2 || got[1] != 2 {
			t.Fatalf("attempts seen for bad = %v, want [1 2]", got)
		}
		mu.Unlock()
		st = rg.gate.Stats()
		if st.Handled != 21 || st.Deferred != 2 || st.DeadLettered != 0 || st.Nacked != 0 {
			t.Fatalf("stats = %+v, want 21 handled, 2 deferred", st)
		}
	})
}

// A permanent error dead-letters the message on its first failure, with
// Watermill's PoisonQueue metadata and the gate's own.
func TestPermanentErrorDeadLettersAtOnce(t *testing.T) {
	_, decodeErr := cost.Decode([]byte("definitely not geometry"))
	if decodeErr == nil {
		t.Fatal("expected a decode error")
	}
	cases := map[string]struct {
		err   error
		cause string
	}{
		"undecodable geometry": {decodeErr, "malformed"},
		"Permanent marker":     {Permanent(errTransient), "permanent"},
	}
	for name, tc := range cases {
		failure := tc.err
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int64
				rg := newRig(t, Config{}, nil, func(msg *message.Message) error {
					calls.Add(1)
					return failure
				}, layers{})
				defer rg.close()
				rg.publish(costed("p", 7))
				synctest.Wait()

				if calls.Load() != 1 {
					t.Fatalf("handler ran %d times, want 1", calls.Load())
				}
				dl := rg.pub.on("in.dead_letter")
				if len(dl) != 1 {
					t.Fatalf("%d dead letters, want 1", len(dl))
				}
				m := dl[0]
				want := map[string]string{
					wmw.ReasonForPoisonedKey: failure.Error(),
					wmw.PoisonedTopicKey:     "in",
					wmw.PoisonedHandlerKey:   "h",
					attemptKey:               "1",
					OriginTopicKey:           "in",
					DeadLetterCauseKey:       tc.cause,
					cost.MetadataKey:         "7", // the original metadata stays
				}
				for k, v := range want {
					if got := m.Metadata.Get(k); got != v {
						t.Errorf("dead letter %s = %q, want %q", k, got, v)
					}
				}
				if m.Metadata.Get(wmw.PoisonedSubscriberKey) == "" {
					t.Errorf("dead letter lacks %s", wmw.PoisonedSubscriberKey)
				}
				if m.UUID != "p" || string(m.Payload) != "payload" {
					t.Errorf("dead letter = %s %q, want the original message", m.UUID, m.Payload)
				}
				st := rg.gate.Stats()
				if st.DeadLettered != 1 || st.deliveries() != 1 || st.Retries != 0 {
					t.Fatalf("stats = %+v", st)
				}
			})
		})
	}
}

// A transient error is retried in process with backoff and dead-lettered
// after MaxAttempts attempts.
func TestTransientErrorDeadLettersAfterMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		ev := &events{}
		cfg := noJitter()
		cfg.MaxAttempts = 3
		rg := newRig(t, cfg, []Option{WithOnOutcome(ev.add)}, func(msg *message.Message) error {
			calls.Add(1)
			return errTransient
		}, layers{})
		defer rg.close()
		rg.publish(message.NewMessage("t", []byte("x")))
		synctest.Wait()
		time.Sleep(time.Hour)
		synctest.Wait()

		if calls.Load() != 3 {
			t.Fatalf("handler ran %d times, want 3", calls.Load())
		}
		dl := rg.pub.on("dlq")
		if len(dl) != 1 {
			t.Fatalf("%d dead letters, want 1", len(dl))
		}
		if got := dl[0].Metadata.Get(attemptKey); got != "3" {
			t.Errorf("attempts = %q, want 3", got)
		}
		if got := dl[0].Metadata.Get(DeadLetterCauseKey); got != "attempts_exhausted" {
			t.Errorf("cause = %q", got)
		}
		if got := dl[0].Metadata.Get(wmw.ReasonForPoisonedKey); got != errTransient.Error() {
			t.Errorf("reason = %q", got)
		}
		st := rg.gate.Stats()
		if st.DeadLettered != 1 || st.Retries != 2 || st.deliveries() != 1 {
			t.Fatalf("stats = %+v", st)
		}
		// Waits of 1s and 2s, no jitter.
		if e := ev.all(); len(e) != 1 || e[0].elapsed != 3*time.Second || e[0].retries != 2 || e[0].attempts != 3 {
			t.Fatalf("events = %+v, want one after 3s, 2 retries, 3 attempts", e)
		}
	})
}

// Attempts accumulate across deferrals: a message deferred after its first
// failure is dead-lettered once its total reaches MaxAttempts, from the
// retry topic, with the retry topic as topic_poisoned and the original as
// its origin.
func TestAttemptsCountAcrossDeferrals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Saturated for the first look only: the one after the first failure.
		var looks atomic.Int64
		pressure := spillway.PressureFunc(func() time.Duration {
			if looks.Add(1) == 1 {
				return time.Second
			}
			return 0
		})
		var calls atomic.Int64
		cfg := Config{MaxAttempts: 3, InitialInterval: time.Second, MaxInterval: time.Minute, Jitter: spillway.Off}
		rg := newRig(t, cfg, []Option{WithPressure(pressure)}, func(msg *message.Message) error {
			calls.Add(1)
			return errTransient
		}, layers{})
		defer rg.close()
		rg.publish(message.NewMessage("x", []byte("x")))
		synctest.Wait()
		if n := len(rg.pub.on("in.retry")); n != 1 || calls.Load() != 1 {
			t.Fatalf("after the first failure: %d retry copies, %d calls; want 1, 1", n, calls.Load())
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if calls.Load() != 3 {
			t.Fatalf("handler ran %d times, want 3", calls.Load())
		}
		dl := rg.pub.on("in.dead_letter")
		if len(dl) != 1 {
			t.Fatalf("%d dead letters, want 1", len(dl))
		}
		m := dl[0].Metadata
		if m.Get(attemptKey) != "3" || m.Get(wmw.PoisonedTopicKey) != "in.retry" ||
			m.Get(wmw.PoisonedHandlerKey) != "h_retry" || m.Get(OriginTopicKey) != "in" {
			t.Fatalf("dead letter metadata = %v", m)
		}
		if in, retry := rg.gate.counts.topic("in"), rg.gate.counts.topic("in.retry"); in.deferred != 1 || retry.deadLettered != 1 || retry.retries != 1 {
			t.Fatalf("stats = %+v", rg.gate.counts.byTopic())
		}
	})
}

// A failed publish to the dead-letter topic nacks the message; it is
// redelivered and dead-lettered once the publisher recovers.
func TestDeadLetterPublishFailureNacks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		ev := &events{}
		rg := newRig(t, noJitter(), []Option{WithOnOutcome(ev.add)}, func(msg *message.Message) error {
			calls.Add(1)
			return Permanent(errTransient)
		}, layers{})
		defer rg.close()
		var failures atomic.Int64
		rg.pub.setFail(func(topic string) bool { return topic == "dlq" && failures.Add(1) <= 2 })
		rg.publish(message.NewMessage("d", []byte("x")))
		synctest.Wait()

		st := rg.gate.Stats()
		if st.Nacked != 2 || st.DeadLettered != 1 || calls.Load() != 3 {
			t.Fatalf("stats = %+v after %d calls, want 2 nacked then dead-lettered", st, calls.Load())
		}
		if n := len(rg.pub.on("dlq")); n != 1 {
			t.Fatalf("%d dead letters, want 1", n)
		}
		var causes []string
		for _, e := range ev.all() {
			causes = append(causes, e.Cause)
		}
		want := []string{causePublishFailed, causePublishFailed, causePermanent}
		if len(causes) != 3 || causes[0] != want[0] || causes[1] != want[1] || causes[2] != want[2] {
			t.Fatalf("causes = %v, want %v", causes, want)
		}
	})
}

// mustVertexBudget is middleware.NewVertexBudget for capacities the test knows
// are valid.
func mustVertexBudget(capacity int64, opts ...middleware.Option) *middleware.VertexBudget {
	b, err := middleware.NewVertexBudget(capacity, opts...)
	if err != nil {
		panic(err)
	}
	return b
}

// A payload that cannot be decoded is dead-lettered at once with cause
// malformed even when a custom classifier calls nothing permanent.
func TestUndecodableDeadLettersWhateverIsPermanentSays(t *testing.T) {
	_, decodeErr := cost.Decode([]byte("definitely not geometry"))
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		rg := newRig(t, Config{}, []Option{WithIsPermanent(func(error) bool { return false })}, func(msg *message.Message) error {
			calls.Add(1)
			return fmt.Errorf("indexing: %w", decodeErr)
		}, layers{})
		defer rg.close()
		rg.publish(costed("p", 7))
		synctest.Wait()
		dl := rg.pub.on("in.dead_letter")
		if calls.Load() != 1 || len(dl) != 1 || dl[0].Metadata.Get(DeadLetterCauseKey) != "malformed" {
			t.Fatalf("handler ran %d times, %d dead letters (%v), want 1 and 1 with cause malformed", calls.Load(), len(dl), dl)
		}
	})
}
