package producer

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
)

// pubRecorder is a publisher that remembers what it was given.
type pubRecorder struct {
	mu       sync.Mutex
	calls    int
	msgs     []*message.Message
	vertices int64
	err      error
	closed   bool
}

func (r *pubRecorder) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.calls++
	r.msgs = append(r.msgs, msgs...)
	for _, m := range msgs {
		n, _ := strconv.ParseInt(m.Metadata.Get(cost.MetadataKey), 10, 64)
		r.vertices += n
	}
	return nil
}

func (r *pubRecorder) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	return nil
}

func (r *pubRecorder) published() (msgs int, vertices int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs), r.vertices
}

func withCount(id string, n int64) *message.Message {
	m := message.NewMessage(id, []byte("x"))
	m.Metadata.Set(cost.MetadataKey, strconv.FormatInt(n, 10))
	return m
}

// Block mode: over a window of fake time, the vertices published match the
// configured rate (after the initial burst) within one message's worth.
func TestRateLimitBlockRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate, burst, size = 1000.0, 500, 100
		rec := &pubRecorder{}
		p := newRL(t, rec, RateLimitConfig{VerticesPerSecond: rate, Burst: burst, Mode: Block})

		start := time.Now()
		var atTwo int64
		for i := 0; time.Since(start) < 10*time.Second; i++ {
			if err := p.Publish("t", withCount(strconv.Itoa(i), size)); err != nil {
				t.Fatal(err)
			}
			if atTwo == 0 && time.Since(start) >= 2*time.Second {
				_, atTwo = rec.published()
			}
		}
		elapsed := time.Since(start)
		_, total := rec.published()

		// Burst plus rate × elapsed, to within one message.
		want := burst + rate*elapsed.Seconds()
		if d := float64(total) - want; d > size || d < -size {
			t.Fatalf("published %d vertices in %v, want %.0f ± %d", total, elapsed, want, size)
		}
		// Steady state, from 2 s on: vertices/s within 2 % of the rate.
		steady := float64(total-atTwo) / (elapsed - 2*time.Second).Seconds()
		if steady < rate*0.98 || steady > rate*1.02 {
			t.Fatalf("steady rate %.1f vertices/s, want %.0f ± 2%%", steady, rate)
		}
		if s := p.Stats(); s.Throttled == 0 || s.Waited <= 0 || s.Rejected != 0 {
			t.Fatalf("stats = %+v, want throttled calls, some wait, no rejection", s)
		}
	})
}

// Concurrent blocked publishers share one bucket.
func TestRateLimitBlockConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &pubRecorder{}
		p := newRL(t, rec, RateLimitConfig{VerticesPerSecond: 1000, Burst: 100, Mode: Block})
		start := time.Now()
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 25 {
					_ = p.Publish("t", withCount(strconv.Itoa(g*100+i), 100))
				}
			})
		}
		wg.Wait()
		// 100 messages of 100 = 10,000 vertices; the first 100 are the
		// burst, the rest take 9.9 s at 1000/s.
		if got, want := time.Since(start), 9900*time.Millisecond; got != want {
			t.Fatalf("took %v, want %v", got, want)
		}
	})
}

func TestRateLimitReject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &pubRecorder{}
		p := newRL(t, rec, RateLimitConfig{VerticesPerSecond: 1000, Burst: 300, Mode: Reject})
		for i := range 3 {
			if err := p.Publish("t", withCount(strconv.Itoa(i), 100)); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
		err := p.Publish("t", withCount("over", 100))
		if !errors.Is(err, ErrRateLimited) {
			t.Fatalf("err = %v, want ErrRateLimited", err)
		}
		// A batch is all or nothing: after 150 ms there are 150 vertices,
		// enough for one of two 100-vertex messages but not both.
		time.Sleep(150 * time.Millisecond)
		err = p.Publish("t", withCount("a", 100), withCount("b", 100))
		if !errors.Is(err, ErrRateLimited) {
			t.Fatalf("batch err = %v, want ErrRateLimited", err)
		}
		if n, _ := rec.published(); n != 3 {
			t.Fatalf("published %d messages, want 3 (nothing from rejected calls)", n)
		}
		// The rejected batch took nothing: one message fits now.
		if err := p.Publish("t", withCount("c", 100)); err != nil {
			t.Fatalf("after refusal: %v", err)
		}
		if s := p.Stats(); s.Rejected != 2 || s.Throttled != 0 || s.Waited != 0 {
			t.Fatalf("stats = %+v", s)
		}
	})
}

// A cancelled wait publishes nothing and gives the vertices back.
func TestRateLimitBlockCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &pubRecorder{}
		p := newRL(t, rec, RateLimitConfig{VerticesPerSecond: 100, Burst: 100, Mode: Block})
		if err := p.Publish("t", withCount("first", 100)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		a, b := withCount("a", 50), withCount("b", 50)
		b.SetContext(ctx) // the second message's context ends first
		err := p.Publish("t", a, b)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want DeadlineExceeded", err)
		}
		if n, _ := rec.published(); n != 1 {
			t.Fatalf("published %d, want 1", n)
		}
		// 200 ms have passed: 20 vertices are back in the bucket, and the
		// cancelled reservation returned its share, so a 20-vertex message
		// goes through without waiting.
		start := time.Now()
		if err := p.Publish("t", withCount("c", 20)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("waited %v after a cancelled reservation, want 0", d)
		}
	})
}

func TestRateLimitChargesAndClamps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &pubRecorder{}
		p := newRL(t, rec, RateLimitConfig{VerticesPerSecond: 1000, Burst: 1000, Mode: Block})
		// Larger than the burst: clamped, waits for a full bucket instead of
		// failing.
		start := time.Now()
		if err := p.Publish("t", withCount("huge", 5000)); err != nil {
			t.Fatal(err)
		}
		if err := p.Publish("t", withCount("huge2", 5000)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("two clamped messages took %v, want 1s", d)
		}
		// An unstamped message costs the default: a full bucket.
		unstamped := message.NewMessage("u", []byte(`{"type":"Point","coordinates":[0,0]}`))
		start = time.Now()
		if err := p.Publish("t", unstamped); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("unstamped message waited %v, want a full bucket (1s)", d)
		}
		// An empty payload with count 0 is free.
		free := message.NewMessage("free", nil)
		free.Metadata.Set(cost.MetadataKey, "0")
		start = time.Now()
		if err := p.Publish("t", free); err != nil || time.Since(start) != 0 {
			t.Fatalf("free message: err %v, waited %v", err, time.Since(start))
		}
	})
}

func TestRateLimitDefaultCostOption(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &pubRecorder{}
		p := newRL(t, rec, RateLimitConfig{VerticesPerSecond: 1, Burst: 10, Mode: Reject, DefaultCost: 4})
		unstamped := func() *message.Message { return message.NewMessage("u", []byte("x")) }
		if err := p.Publish("t", unstamped(), unstamped()); err != nil {
			t.Fatal(err)
		}
		if err := p.Publish("t", withCount("k", 2)); err != nil {
			t.Fatal(err)
		}
		if c := charged(p); c != 10 {
			t.Fatalf("charged %v vertices, want 4+4+2", c)
		}
		if err := p.Publish("t", unstamped()); !errors.Is(err, ErrRateLimited) {
			t.Fatalf("err = %v, want ErrRateLimited", err)
		}
		big := newRL(t, rec, RateLimitConfig{VerticesPerSecond: 1, Burst: 10, DefaultCost: 50})
		if c := big.defaultCost; c != 10 {
			t.Fatalf("default cost in effect %d, want it clamped to the burst (10)", c)
		}
	})
}

// charged returns the vertices taken from p's bucket since it was full.
// Inside a synctest bubble no time passes between publishes, so nothing
// has been refilled.
func charged(p *RateLimited) float64 {
	return float64(p.burst) - p.lim.Tokens()
}

// The stamper must sit outside the rate limiter: it stamps, then calls the
// limiter, which charges the stamped count. The other way round the limiter
// sees unstamped messages and charges its default.
func TestRateLimitCompositionWithStamper(t *testing.T) {
	synctest.Test(t, testRateLimitCompositionWithStamper)
}

func testRateLimitCompositionWithStamper(t *testing.T) {
	// A LineString of 4 vertices.
	payload := []byte(`{"type":"LineString","coordinates":[[0,0],[1,1],[2,2],[3,3]]}`)

	rec := &pubRecorder{}
	limited := newRL(t, rec, RateLimitConfig{VerticesPerSecond: 1000, Burst: 1000, Mode: Reject})
	right := cost.NewStampingPublisher(limited)
	if err := right.Publish("t", message.NewMessage("a", payload)); err != nil {
		t.Fatal(err)
	}
	if c := charged(limited); c != 4 {
		t.Fatalf("stamp(ratelimit(...)) charged %v vertices, want 4", c)
	}

	rec2 := &pubRecorder{}
	limited2 := newRL(t, cost.NewStampingPublisher(rec2), RateLimitConfig{VerticesPerSecond: 1000, Burst: 1000, Mode: Reject})
	if err := limited2.Publish("t", message.NewMessage("b", payload)); err != nil {
		t.Fatal(err)
	}
	if c := charged(limited2); c != 1000 {
		t.Fatalf("ratelimit(stamp(...)) charged %v vertices, want the default 1000", c)
	}
	if _, v := rec2.published(); v != 4 {
		t.Fatalf("stamped count %d, want 4", v)
	}
}

// newRL builds a RateLimited publisher from a valid configuration.
func newRL(t *testing.T, pub message.Publisher, cfg RateLimitConfig) *RateLimited {
	t.Helper()
	p, err := NewRateLimited(pub, cfg)
	if err != nil {
		t.Fatalf("NewRateLimited: %v", err)
	}
	return p
}

// Bad input is an error naming what is wrong, never a panic.
func TestNewRateLimitedRejects(t *testing.T) {
	for _, c := range []struct {
		name  string
		pub   message.Publisher
		cfg   RateLimitConfig
		want  error
		field string
	}{
		{"nil publisher", nil, RateLimitConfig{VerticesPerSecond: 1, Burst: 1}, spillway.ErrInvalidConfig, "pub"},
		{"zero rate", &pubRecorder{}, RateLimitConfig{Burst: 1}, spillway.ErrInvalidConfig, "vertices_per_second"},
		{"negative rate", &pubRecorder{}, RateLimitConfig{VerticesPerSecond: -1, Burst: 1}, spillway.ErrInvalidConfig, "vertices_per_second"},
		{"NaN rate", &pubRecorder{}, RateLimitConfig{VerticesPerSecond: nan(), Burst: 1}, spillway.ErrInvalidConfig, "vertices_per_second"},
		{"infinite rate", &pubRecorder{}, RateLimitConfig{VerticesPerSecond: math.Inf(1), Burst: 1}, spillway.ErrInvalidConfig, "vertices_per_second"},
		{"negative burst", &pubRecorder{}, RateLimitConfig{VerticesPerSecond: 1, Burst: -1}, spillway.ErrInvalidConfig, "burst"},
		{"unknown mode", &pubRecorder{}, RateLimitConfig{VerticesPerSecond: 1, Mode: "drop"}, spillway.ErrInvalidConfig, "mode"},
		{"negative default cost", &pubRecorder{}, RateLimitConfig{VerticesPerSecond: 1, DefaultCost: -1}, spillway.ErrInvalidConfig, "default_cost"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewRateLimited(c.pub, c.cfg)
			if p != nil || !errors.Is(err, c.want) {
				t.Fatalf("NewRateLimited = %v, %v; want nil, %v", p, err, c.want)
			}
			var ce *spillway.FieldError
			if c.field != "" && (!errors.As(err, &ce) || ce.Field != c.field) {
				t.Fatalf("err = %v, want a FieldError on %s", err, c.field)
			}
		})
	}
	// Validate reports every bad field at once; a zero rate only means
	// "off" to Validate.
	err := RateLimitConfig{VerticesPerSecond: -1, Burst: -1, Mode: "x"}.Validate()
	if j, ok := err.(interface{ Unwrap() []error }); !ok || len(j.Unwrap()) != 3 {
		t.Fatalf("Validate = %v, want three errors", err)
	}
	if err := (RateLimitConfig{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
}

// Zero fields take their defaults: block, vertex_count, a burst of one
// second at the rate (rounded up), unstamped messages charged the burst.
func TestRateLimitDefaults(t *testing.T) {
	synctest.Test(t, testRateLimitDefaults)
}

func testRateLimitDefaults(t *testing.T) {
	c := RateLimitConfig{VerticesPerSecond: 2.5}.WithDefaults()
	if c.Burst != 3 || c.Mode != Block || c.DefaultCost != 3 {
		t.Fatalf("defaults = %+v", c)
	}
	if b := (RateLimitConfig{VerticesPerSecond: 1e300}).WithDefaults().Burst; b != maxBurst {
		t.Fatalf("burst of a huge rate = %d, want %d", b, maxBurst)
	}
	p := newRL(t, &pubRecorder{}, RateLimitConfig{VerticesPerSecond: 1000})
	if p.burst != 1000 || p.mode != Block || p.defaultCost != 1000 {
		t.Fatalf("in effect: burst %d, mode %s, default cost %d", p.burst, p.mode, p.defaultCost)
	}
	if l := p.lim.Limit(); l != 1000 {
		t.Fatalf("limiter rate %v, want 1000", l)
	}
	if err := p.Publish("t", message.NewMessage("u", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	if c := charged(p); c != 1000 {
		t.Fatalf("unstamped message charged %v, want the burst", c)
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}

func TestRateLimitPassesErrorsAndClose(t *testing.T) {
	boom := errors.New("boom")
	rec := &pubRecorder{err: boom}
	p := newRL(t, rec, RateLimitConfig{VerticesPerSecond: 10, Burst: 10, Mode: Reject})
	if err := p.Publish("t", withCount("a", 1)); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the wrapped publisher's", err)
	}
	if err := p.Close(); err != nil || !rec.closed {
		t.Fatalf("Close: %v, closed %v", err, rec.closed)
	}
	if p.mode != Reject || Block != "block" {
		t.Fatal("mode names")
	}
}
