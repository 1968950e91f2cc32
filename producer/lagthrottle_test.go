package producer

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
)

type fakeLag struct{ n atomic.Int64 }

func (f *fakeLag) TotalLag() int64 { return f.n.Load() }

func TestThrottleDelay(t *testing.T) {
	const step, maxD = 100 * time.Millisecond, 5 * time.Second
	for _, c := range []struct {
		lag  int64
		want time.Duration
	}{
		{0, 0},
		{999, 0},
		{1000, 0}, // at the threshold: no delay
		{1500, 50 * time.Millisecond},
		{2000, 100 * time.Millisecond},
		{11000, time.Second},
		{51000, maxD},
		{1 << 62, maxD},
		{1001, 100 * time.Microsecond},
	} {
		if got := throttleDelay(c.lag, 1000, step, maxD); got != c.want {
			t.Errorf("lag %d: delay %v, want %v", c.lag, got, c.want)
		}
	}
}

// The throttle engages above the threshold, in proportion, and releases as
// soon as the lag falls back.
func TestLagThrottleEngagesAndReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lag := &fakeLag{}
		rec := &pubRecorder{}
		p := newLT(t, rec, lag, LagThrottleConfig{Threshold: 1000, Step: 200 * time.Millisecond, Max: time.Second})

		timed := func() time.Duration {
			t.Helper()
			start := time.Now()
			if err := p.Publish("t", withCount("m", 1)); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}

		lag.n.Store(800)
		if d := timed(); d != 0 {
			t.Fatalf("below threshold waited %v", d)
		}
		lag.n.Store(3000) // 2 thresholds over: 400 ms
		if d := timed(); d != 400*time.Millisecond {
			t.Fatalf("at 3× threshold waited %v, want 400ms", d)
		}
		lag.n.Store(100_000) // capped
		if d := timed(); d != time.Second {
			t.Fatalf("far above threshold waited %v, want the 1s cap", d)
		}
		lag.n.Store(1000)
		if d := timed(); d != 0 {
			t.Fatalf("released at threshold but waited %v", d)
		}
		if n, _ := rec.published(); n != 4 {
			t.Fatalf("published %d, want 4", n)
		}
		if s := p.Stats(); s.Throttled != 2 || s.Waited != 1400*time.Millisecond {
			t.Fatalf("stats = %+v", s)
		}
	})
}

func TestLagThrottleHonoursContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lag := &fakeLag{}
		lag.n.Store(1 << 40)
		rec := &pubRecorder{}
		p := newLT(t, rec, lag, LagThrottleConfig{Threshold: 10}) // 5 s cap
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		m := withCount("m", 1)
		m.SetContext(ctx)
		start := time.Now()
		err := p.Publish("t", m)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want DeadlineExceeded", err)
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("gave up after %v, want 1s", d)
		}
		if n, _ := rec.published(); n != 0 {
			t.Fatalf("published %d, want none", n)
		}
	})
}

// The throttle and the rate limiter compose: both waits add up.
func TestLagThrottleComposesWithRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lag := &fakeLag{}
		lag.n.Store(2000)
		rec := &pubRecorder{}
		p := newLT(t, newRL(t, rec, RateLimitConfig{VerticesPerSecond: 100, Burst: 100, Mode: Block}), lag, LagThrottleConfig{Threshold: 1000})
		start := time.Now()
		for range 2 {
			if err := p.Publish("t", withCount("m", 100)); err != nil {
				t.Fatal(err)
			}
		}
		// Throttle 100 ms each; the second also waits for the bucket to
		// refill 100 vertices at 100/s, of which 100 ms have passed.
		if d := time.Since(start); d != 1100*time.Millisecond {
			t.Fatalf("took %v, want 1.1s", d)
		}
	})
}

// newLT builds a LagThrottled publisher from a valid configuration.
func newLT(t *testing.T, pub message.Publisher, lag interface{ TotalLag() int64 }, cfg LagThrottleConfig) *LagThrottled {
	t.Helper()
	p, err := NewLagThrottled(pub, lag, cfg)
	if err != nil {
		t.Fatalf("NewLagThrottled: %v", err)
	}
	return p
}

// Bad input is an error naming what is wrong, never a panic.
func TestNewLagThrottledRejects(t *testing.T) {
	for _, c := range []struct {
		name  string
		pub   message.Publisher
		lag   interface{ TotalLag() int64 }
		cfg   LagThrottleConfig
		want  error
		field string
	}{
		{"nil publisher", nil, &fakeLag{}, LagThrottleConfig{Threshold: 1}, spillway.ErrInvalidConfig, "pub"},
		{"nil reader", &pubRecorder{}, nil, LagThrottleConfig{Threshold: 1}, spillway.ErrInvalidConfig, "lag"},
		{"zero threshold", &pubRecorder{}, &fakeLag{}, LagThrottleConfig{}, spillway.ErrInvalidConfig, "threshold"},
		{"negative threshold", &pubRecorder{}, &fakeLag{}, LagThrottleConfig{Threshold: -1}, spillway.ErrInvalidConfig, "threshold"},
		{"negative step", &pubRecorder{}, &fakeLag{}, LagThrottleConfig{Threshold: 1, Step: -time.Second}, spillway.ErrInvalidConfig, "step"},
		{"negative max", &pubRecorder{}, &fakeLag{}, LagThrottleConfig{Threshold: 1, Max: -time.Second}, spillway.ErrInvalidConfig, "max"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewLagThrottled(c.pub, c.lag, c.cfg)
			if p != nil || !errors.Is(err, c.want) {
				t.Fatalf("NewLagThrottled = %v, %v; want nil, %v", p, err, c.want)
			}
			var ce *spillway.FieldError
			if c.field != "" && (!errors.As(err, &ce) || ce.Field != c.field) {
				t.Fatalf("err = %v, want a FieldError on %s", err, c.field)
			}
		})
	}
	// Zero fields take their defaults; a zero threshold only means "off"
	// to Validate.
	if err := (LagThrottleConfig{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	if c := (LagThrottleConfig{}).WithDefaults(); c.Step != defaultThrottleStep || c.Max != defaultThrottleMax {
		t.Fatalf("defaults = %+v", c)
	}
	rec := &pubRecorder{}
	if err := newLT(t, rec, &fakeLag{}, LagThrottleConfig{Threshold: 1}).Close(); err != nil || !rec.closed {
		t.Fatal("Close must close the wrapped publisher")
	}
}
