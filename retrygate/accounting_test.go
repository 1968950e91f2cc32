package retrygate

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
)

// Over 10,000 messages with random transient and permanent failures, random
// saturation and random publish failures, every delivery ends in exactly
// one outcome, the outcomes add up to the deliveries the router made
// (fresh publishes + republishes to the retry topic + nack redeliveries),
// and every message ends handled or dead-lettered exactly once.
//
// With defer: nack (2,000 messages) deferrals are redeliveries too.
func TestAccountingUnderRandomFailures(t *testing.T) {
	for _, tc := range []struct {
		mode DeferMode
		n    int
	}{{DeferRepublish, 10_000}, {DeferNack, 2_000}} {
		t.Run(string(tc.mode), func(t *testing.T) { testAccounting(t, tc.mode, tc.n) })
	}
}

func testAccounting(t *testing.T, mode DeferMode, n int) {
	synctest.Test(t, func(t *testing.T) {
		var rmu sync.Mutex
		rng := rand.New(rand.NewPCG(7, 11))
		chance := func(p float64) bool {
			rmu.Lock()
			defer rmu.Unlock()
			return rng.Float64() < p
		}

		var deliveries atomic.Int64
		counter := func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				deliveries.Add(1)
				return h(msg)
			}
		}

		var tmu sync.Mutex
		terminal := map[string]int{} // uuid -> handled or dead-lettered endings
		var ended atomic.Int64
		var bad atomic.Int64
		onOutcome := func(e Event) {
			if e.Outcome == Deferred && e.Cause == causeNone || e.Outcome == Handled && e.Err != nil {
				bad.Add(1)
			}
			if e.Outcome != Handled && e.Outcome != DeadLettered {
				return
			}
			tmu.Lock()
			terminal[e.Message.UUID]++
			tmu.Unlock()
			ended.Add(1)
		}

		cfg := Config{
			MaxAttempts:     4,
			InitialInterval: 10 * time.Millisecond,
			MaxInterval:     time.Second,
			MaxElapsedTime:  3 * time.Second,
			RetryRate:       200,
			RetryBurst:      50,
			RetryRatio:      0.2,
			Defer:           mode,
		}
		opts := []Option{
			WithPressure(spillway.PressureFunc(func() time.Duration {
				if chance(0.3) {
					return time.Second
				}
				return 0
			})),
			WithOnOutcome(onOutcome),
		}
		rg := newRig(t, cfg, opts, func(msg *message.Message) error {
			switch {
			case chance(0.002):
				return Permanent(errTransient)
			case chance(0.3):
				return errTransient
			}
			return nil
		}, layers{outer: []message.HandlerMiddleware{counter}})
		defer rg.close()
		rg.pub.setFail(func(topic string) bool { return chance(0.02) })

		batch := make([]*message.Message, 0, 500)
		for i := range n {
			batch = append(batch, message.NewMessage("m"+strconv.Itoa(i), []byte("x")))
			if len(batch) == cap(batch) {
				rg.publish(batch...)
				batch = batch[:0]
			}
		}
		for i := 0; ended.Load() < int64(n); i++ {
			if i == 10_000 {
				t.Fatalf("only %d of %d messages ended after %v", ended.Load(), n, 10_000*100*time.Millisecond)
			}
			synctest.Wait()
			time.Sleep(100 * time.Millisecond)
		}
		synctest.Wait()

		st := rg.gate.Stats()
		retried := uint64(len(rg.pub.on("in.retry")))
		deadLetters := uint64(len(rg.pub.on("in.dead_letter")))
		t.Logf("deliveries %d: %+v", deliveries.Load(), st)

		if got := st.deliveries(); got != uint64(deliveries.Load()) {
			t.Fatalf("outcomes %d != deliveries %d", got, deliveries.Load())
		}
		// Each deferral is one more delivery: of the retry topic's copy, or
		// of the nacked message itself.
		if published := uint64(n) + st.Deferred + st.Nacked; st.deliveries() != published {
			t.Fatalf("handled %d + deferred %d + dead-lettered %d + nacked %d = %d, want published %d (fresh %d + deferred %d + nacked %d)",
				st.Handled, st.Deferred, st.DeadLettered, st.Nacked, st.deliveries(), published, n, st.Deferred, st.Nacked)
		}
		if st.Handled+st.DeadLettered != uint64(n) {
			t.Fatalf("handled %d + dead-lettered %d != %d messages", st.Handled, st.DeadLettered, n)
		}
		if mode == DeferNack {
			retried = st.Deferred // nothing is republished
		}
		if st.Deferred != retried || st.DeadLettered != deadLetters {
			t.Fatalf("counted %d deferred / %d dead-lettered, topics hold %d / %d", st.Deferred, st.DeadLettered, retried, deadLetters)
		}
		if len(terminal) != n {
			t.Fatalf("%d distinct messages ended, want %d", len(terminal), n)
		}
		for id, k := range terminal {
			if k != 1 {
				t.Fatalf("message %s ended %d times", id, k)
			}
		}
		if bad.Load() != 0 {
			t.Fatalf("%d inconsistent events", bad.Load())
		}
		var byTopic uint64
		for _, c := range rg.gate.counts.byTopic() {
			byTopic += c.deliveries()
		}
		if byTopic != st.deliveries() {
			t.Fatalf("per-topic deliveries %d != total %d", byTopic, st.deliveries())
		}
		// Every path was exercised.
		// In nack mode GoChannel gives no redelivery signal and little is
		// published, so arrivals and publish failures are rare there.
		rare := rg.gate.counts.snapshot().onArrival > 0 && st.Nacked > 0 || mode == DeferNack
		if st.Retries == 0 || st.Deferred == 0 || st.DeadLettered == 0 || !rare {
			t.Fatalf("a path was never taken: %+v", st)
		}
	})
}
