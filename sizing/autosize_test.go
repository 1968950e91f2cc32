package sizing_test

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/sizing"
)

// The auto-sizer resizes the budget through sizing.Resizable, which the
// middleware package's budget implements (sizing does not depend on middleware).
var _ sizing.Resizable = (*middleware.VertexBudget)(nil)

// fakeBudget records resizes and fails the test if one leaves [floor,
// ceiling].
type fakeBudget struct {
	t              *testing.T
	floor, ceiling int64

	mu      sync.Mutex
	cap     int64
	resizes []int64
}

func (b *fakeBudget) Capacity() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cap
}

func (b *fakeBudget) Resize(c int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c < b.floor || c > b.ceiling {
		b.t.Errorf("resized to %d, outside [%d, %d]", c, b.floor, b.ceiling)
	}
	b.cap = c
	b.resizes = append(b.resizes, c)
	return nil
}

// stream is synthetic traffic: producers each send one message after
// another (pausing gap between them) until the fake clock reaches until.
// Each message is stamped with its vertices and its handler sleeps
// vertices × perVertex, both read from the shape at the time it is sent.
type stream struct {
	producers int
	gap       time.Duration
	shape     atomic.Pointer[shape]
	sent      atomic.Int64
}

type shape struct {
	vertices  int
	perVertex time.Duration
	unstamped bool
}

func (s *stream) run(t *testing.T, h message.HandlerFunc, until time.Time) {
	var wg sync.WaitGroup
	for range s.producers {
		wg.Go(func() {
			for time.Now().Before(until) {
				sh := s.shape.Load()
				msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
				if !sh.unstamped {
					msg.Metadata.Set(cost.MetadataKey, strconv.Itoa(sh.vertices))
				}
				if _, err := h(msg); err != nil {
					t.Error(err)
					return
				}
				s.sent.Add(1)
				if s.gap > 0 {
					time.Sleep(s.gap)
				}
			}
		})
	}
	wg.Wait()
}

// work is the handler: it sleeps for as long as the message's shape says.
func work(msg *message.Message) ([]*message.Message, error) {
	n, _ := strconv.Atoi(msg.Metadata.Get(cost.MetadataKey))
	time.Sleep(time.Duration(n) * time.Duration(perVertexNanos(msg)))
	return nil, nil
}

// perVertexNanos reads the per-vertex time the test stored in the
// message's metadata.
func perVertexNanos(msg *message.Message) int64 {
	v, _ := strconv.ParseInt(msg.Metadata.Get("per_vertex_ns"), 10, 64)
	return v
}

// withPerVertex stamps the handler's per-vertex time on every message, so
// the work a message stands for is fixed when it is sent.
func withPerVertex(s *stream, h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		msg.Metadata.Set("per_vertex_ns", strconv.FormatInt(int64(s.shape.Load().perVertex), 10))
		return h(msg)
	}
}

// A stream whose mix shifts from light to heavy geometry, through a real
// budget middleware with the auto-sizer inside it. Light: 100-vertex
// messages at 10 µs a vertex; with 4 handlers at once that is 400k
// vertices/s, a deadline bound of 200k, so the memory bound (40k) binds.
// Heavy: 1000-vertex messages at 100 µs a vertex, 40k vertices/s, a
// deadline bound of 20k, which binds. The budget must shrink to it within
// a bounded number of windows: the median of 5 windows turns once 3 are
// heavy, and the window the shift falls in may be mixed, so 4 windows (plus
// one message, since windows close when a message completes).
func TestAutoSizerFollowsMixShift(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const window = time.Second
		vb := mustVertexBudget(30_000)
		type resize struct {
			at       time.Time
			from, to int64
			binding  string
		}
		var resizes []resize
		sizer, err := sizing.New(vb, sizing.Config{
			Deadline:    time.Second,
			Parallelism: 4, // the 4 producers: their sleeps overlap as 4 cores would
			MemoryBound: 40_000,
			Floor:       1_000,
			Window:      window,
			Windows:     5,
		}, sizing.WithOnResize(func(from, to int64, b sizing.Bounds) {
			resizes = append(resizes, resize{time.Now(), from, to, b.Binding})
		}))
		if err != nil {
			t.Fatal(err)
		}
		budget, err := middleware.New(vb)
		if err != nil {
			t.Fatal(err)
		}
		s := &stream{producers: 4}
		s.shape.Store(&shape{vertices: 100, perVertex: 10 * time.Microsecond})
		h := withPerVertex(s, budget.Middleware(sizer.Middleware(work)))

		start := time.Now()
		shift := start.Add(8 * window)
		go func() {
			time.Sleep(time.Until(shift))
			s.shape.Store(&shape{vertices: 1000, perVertex: 100 * time.Microsecond})
		}()
		s.run(t, h, start.Add(16*window))

		b := sizer.Bounds()
		for _, r := range resizes {
			t.Logf("resize at %v (shift at %v): %d → %d, %s binds", r.at.Sub(start), shift.Sub(start), r.from, r.to, r.binding)
		}
		t.Logf("sent %d messages; final %+v", s.sent.Load(), b)
		if len(resizes) < 2 {
			t.Fatalf("%d resizes, want a grow on light traffic and a shrink on heavy", len(resizes))
		}
		grow, shrink := resizes[0], resizes[len(resizes)-1]
		if grow.to != 40_000 || grow.binding != "memory" || !grow.at.Before(shift) {
			t.Errorf("light traffic: %+v, want a resize to the memory bound 40000 before the shift", grow)
		}
		if shrink.binding != "deadline" || shrink.to > 22_000 || shrink.to < 18_000 {
			t.Errorf("heavy traffic: %+v, want a resize to about 20000, bound by the deadline", shrink)
		}
		first := resizes[1]
		if lag := first.at.Sub(shift); first.to >= 40_000 || lag > 4*window+200*time.Millisecond {
			t.Errorf("first resize after the shift: %+v, %v after it; want a shrink within 4 windows", first, lag)
		}
		if b.Binding != "deadline" || vb.Capacity() != shrink.to || b.MemoryBound != 40_000 || sizing.MeasuredWindows(sizer) != 5 {
			t.Errorf("bounds %+v", b)
		}
		if b.DeadlineBound < 18_000 || b.DeadlineBound > 22_000 || b.VerticesPerSecond < 36_000 || b.VerticesPerSecond > 44_000 {
			t.Errorf("deadline bound %d at %.0f vertices/s, want about 20000 at 40000", b.DeadlineBound, b.VerticesPerSecond)
		}
		if st := vb.Stats(); st.InUse != 0 || st.Capacity != shrink.to {
			t.Errorf("budget after the stream: %+v", st)
		}
	})
}

// Throughput is vertices over busy time, not over wall time: idle gaps
// between messages must not read as a slow handler.
func TestAutoSizerMeasuresBusyTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 1_000_000}
		sizer, err := sizing.New(fb, sizing.Config{Deadline: 2 * time.Second, Window: time.Second, Parallelism: 1})
		if err != nil {
			t.Fatal(err)
		}
		// One handler at a time, 100 vertices in 1 ms, then 3 ms idle:
		// 100k vertices per busy second, 25k per wall-clock second.
		s := &stream{producers: 1, gap: 3 * time.Millisecond}
		s.shape.Store(&shape{vertices: 100, perVertex: 10 * time.Microsecond})
		s.run(t, withPerVertex(s, sizer.Middleware(work)), time.Now().Add(10*time.Second))

		b := sizer.Bounds()
		if b.VerticesPerSecond < 99_000 || b.VerticesPerSecond > 101_000 {
			t.Errorf("%.0f vertices/s, want 100000 (per busy second)", b.VerticesPerSecond)
		}
		// Deadline bound: 100k × 2 s × 0.5; no memory bound, no ceiling.
		if b.Binding != "deadline" || b.Budget < 99_000 || b.Budget > 101_000 || b.Budget != b.DeadlineBound {
			t.Errorf("bounds %+v, want a deadline-bound budget of about 100000", b)
		}
		if fb.Capacity() != b.Budget {
			t.Errorf("capacity %d, want %d", fb.Capacity(), b.Budget)
		}
	})
}

func TestAutoSizerFloorAndCeiling(t *testing.T) {
	tests := []struct {
		name      string
		cfg       sizing.Config
		start     int64
		shape     shape
		producers int
		want      int64
		clamp     string
	}{
		{
			// 400k vertices/s: a deadline bound of 400k, far above the ceiling.
			name:      "fast handler stops at the ceiling",
			cfg:       sizing.Config{Floor: 1_000, Ceiling: 5_000},
			start:     2_000,
			shape:     shape{vertices: 100, perVertex: 10 * time.Microsecond},
			producers: 4,
			want:      5_000,
			clamp:     "ceiling",
		},
		{
			// 1000 vertices/s: a deadline bound of 1000, below the floor.
			name:      "slow handler stops at the floor",
			cfg:       sizing.Config{Floor: 2_000, Ceiling: 50_000},
			start:     30_000,
			shape:     shape{vertices: 1000, perVertex: time.Millisecond},
			producers: 1,
			want:      2_000,
			clamp:     "floor",
		},
		{
			// A capacity that starts above the ceiling is brought into
			// range even though the target is within the hysteresis.
			name:      "out of range start",
			cfg:       sizing.Config{Floor: 1_000, Ceiling: 5_000, Hysteresis: 0.5},
			start:     6_000,
			shape:     shape{vertices: 100, perVertex: 10 * time.Microsecond},
			producers: 4,
			want:      5_000,
			clamp:     "ceiling",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				fb := &fakeBudget{t: t, floor: tt.cfg.Floor, ceiling: tt.cfg.Ceiling, cap: tt.start}
				cfg := tt.cfg
				cfg.Deadline, cfg.Window = 2*time.Second, time.Second
				cfg.Parallelism = tt.producers // each producer's sleeps stand for one core
				resizes := 0
				sizer, err := sizing.New(fb, cfg, sizing.WithOnResize(func(int64, int64, sizing.Bounds) { resizes++ }))
				if err != nil {
					t.Fatal(err)
				}
				s := &stream{producers: tt.producers}
				s.shape.Store(&tt.shape)
				s.run(t, withPerVertex(s, sizer.Middleware(work)), time.Now().Add(8*time.Second))
				b := sizer.Bounds()
				// The deadline bound binds, but the floor or the ceiling
				// held the budget off it.
				held := tt.clamp == "floor" && b.DeadlineBound < tt.want || tt.clamp == "ceiling" && b.DeadlineBound > tt.want
				if fb.Capacity() != tt.want || b.Budget != tt.want || !held || b.Binding != "deadline" {
					t.Errorf("capacity %d, bounds %+v; want %d clamped at the %s", fb.Capacity(), b, tt.want, tt.clamp)
				}
				if resizes != 1 || len(fb.resizes) != 1 {
					t.Errorf("%d resizes (%v), want exactly 1", resizes, fb.resizes)
				}
			})
		})
	}
}

// A target within the hysteresis of the capacity leaves it alone.
func TestAutoSizerHysteresis(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 40_000}
		sizer, err := sizing.New(fb, sizing.Config{Deadline: time.Second, Window: time.Second, Parallelism: 1})
		if err != nil {
			t.Fatal(err)
		}
		// 76 vertices a millisecond: 76k vertices/s, a target of 38k, 5 %
		// below the capacity.
		s := &stream{producers: 1}
		s.shape.Store(&shape{vertices: 76, perVertex: time.Millisecond / 76})
		s.run(t, withPerVertex(s, sizer.Middleware(work)), time.Now().Add(8*time.Second))
		b := sizer.Bounds()
		if len(fb.resizes) != 0 || fb.Capacity() != 40_000 {
			t.Errorf("resized %v for a 5 %% change", fb.resizes)
		}
		if b.Budget < 37_000 || b.Budget > 39_000 {
			t.Errorf("target %d, want about 38000", b.Budget)
		}
	})
}

// Messages whose cost is unknown (no vertex_count) would teach the sizer a
// made-up rate: they pass through unmeasured.
func TestAutoSizerSkipsUnknownCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 40_000}
		sizer, err := sizing.New(fb, sizing.Config{Deadline: time.Second, Window: time.Second, Parallelism: 1})
		if err != nil {
			t.Fatal(err)
		}
		s := &stream{producers: 2}
		s.shape.Store(&shape{vertices: 100, perVertex: 10 * time.Microsecond, unstamped: true})
		var ran atomic.Int64
		h := func(msg *message.Message) ([]*message.Message, error) {
			ran.Add(1)
			time.Sleep(time.Millisecond)
			return nil, nil
		}
		s.run(t, withPerVertex(s, sizer.Middleware(h)), time.Now().Add(5*time.Second))
		if b := sizer.Bounds(); sizing.MeasuredWindows(sizer) != 0 || len(fb.resizes) != 0 || ran.Load() != s.sent.Load() || ran.Load() == 0 {
			t.Errorf("bounds %+v after %d unstamped messages (%d ran)", b, s.sent.Load(), ran.Load())
		}
	})
}

// Failing handler calls count as busy time but complete no vertices.
func TestAutoSizerCountsFailuresAsNoWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &fakeBudget{t: t, floor: 10, ceiling: 1 << 40, cap: 40_000}
		sizer, err := sizing.New(fb, sizing.Config{Deadline: time.Second, Window: time.Second, Floor: 10, Parallelism: 1})
		if err != nil {
			t.Fatal(err)
		}
		var n atomic.Int64
		h := func(msg *message.Message) ([]*message.Message, error) {
			time.Sleep(time.Millisecond)
			if n.Add(1)%2 == 0 {
				return nil, errors.New("failed")
			}
			return nil, nil
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			mw := sizer.Middleware(h)
			for end := time.Now().Add(6 * time.Second); time.Now().Before(end); {
				msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
				msg.Metadata.Set(cost.MetadataKey, "100")
				mw(msg) //nolint:errcheck // half fail on purpose
			}
		})
		wg.Wait()
		// Half the calls complete 100 vertices in 1 ms: 50k per busy second.
		if b := sizer.Bounds(); b.VerticesPerSecond < 49_000 || b.VerticesPerSecond > 51_000 {
			t.Errorf("%.0f vertices/s, want 50000", b.VerticesPerSecond)
		}
	})
}

func TestAutoSizerBegin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 1_000}
		sizer, err := sizing.New(fb, sizing.Config{Deadline: time.Second, Window: time.Second, MinWindows: 1, Parallelism: 1})
		if err != nil {
			t.Fatal(err)
		}
		for range 30 {
			end := sizing.Begin(sizer)
			time.Sleep(100 * time.Millisecond)
			end(1_000)
			end(1_000) // a second call is ignored
		}
		if b := sizer.Bounds(); math.Abs(b.VerticesPerSecond-10_000) > 1e-6 || b.Budget != 5_000 || fb.Capacity() != 5_000 {
			t.Errorf("bounds %+v, want 10000 vertices/s and a budget of 5000", b)
		}
	})
}

// The tail guard: a call that takes longer than TailShare × Deadline
// shrinks the budget from that one window, before MinWindows, in
// proportion (1.5 s at a capacity of 100k against 0.75 × 1 s: 50k).
// Growing back takes Windows windows without a slow call.
func TestAutoSizerTailShrinksReadily(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 100_000}
		var resizes []sizing.Bounds
		sizer, err := sizing.New(fb, sizing.Config{Deadline: time.Second, Window: time.Second, Ceiling: 100_000, Hysteresis: -1, Parallelism: 1},
			sizing.WithOnResize(func(_, _ int64, b sizing.Bounds) { resizes = append(resizes, b) }))
		if err != nil {
			t.Fatal(err)
		}
		call := func(d time.Duration, vertices int64) {
			end := sizing.Begin(sizer)
			time.Sleep(d)
			end(vertices)
		}
		call(1500*time.Millisecond, 1_000)
		if len(resizes) != 1 || fb.Capacity() != 50_000 {
			t.Fatalf("after one slow call: capacity %d, resizes %+v; want 50000 at once", fb.Capacity(), resizes)
		}
		if b := resizes[0]; b.Binding != "tail" || b.TailBound != 50_000 {
			t.Errorf("bounds %+v, want the tail guard to bind at 50000 after a 1.5 s call", b)
		}
		// Fast windows: 10k-vertex calls of 100 ms, 100k vertices/s, a
		// deadline bound of 50k. The tail bound of each is large, but the
		// median of the windows holds the slow one until it is outvoted,
		// and the throughput bound caps the budget anyway.
		for i := range 5 {
			for range 10 {
				call(100*time.Millisecond, 10_000)
			}
			tb := sizer.Bounds().TailBound
			switch {
			case i < 4 && tb != 50_000:
				// The slow window is still one of the last 5.
				t.Errorf("tail bound %d after %d fast windows, want it held at 50000", tb, i+1)
			case i == 4 && tb <= 50_000:
				t.Errorf("tail bound %d after 5 fast windows, want it lifted", tb)
			}
		}
		if b := sizer.Bounds(); b.Binding != "deadline" || fb.Capacity() != 50_000 || b.DeadlineBound != 50_000 {
			t.Errorf("after fast windows: %+v, want the throughput bound of 50000 and no tail limit", b)
		}
	})
}

// The tail bound never goes below the vertices of the call that set it: a
// message that is slow alone runs alone at that size, and a smaller budget
// would not make it faster.
func TestAutoSizerTailFloorsAtTheSlowCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 10_000}
		sizer, err := sizing.New(fb, sizing.Config{Deadline: time.Second, Window: time.Second, Ceiling: 10_000, Parallelism: 1})
		if err != nil {
			t.Fatal(err)
		}
		end := sizing.Begin(sizer)
		time.Sleep(1500 * time.Millisecond) // 0.75 / 1.5 × 10k would be 5k
		end(8_000)
		if c := fb.Capacity(); c != 8_000 {
			t.Errorf("capacity %d, want 8000: the slow call's own size", c)
		}
	})
}

// A call larger than the capacity was clamped and ran alone, holding its
// own size: its time is read against that, not the smaller capacity. 0.5 s
// for 20k vertices against 0.75 × 1 s is a tail bound of 30k (read against
// the capacity of 10k it would be 15k, and the budget could never grow
// past one heavy message).
func TestAutoSizerTailClampedCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 10_000}
		sizer, err := sizing.New(fb, sizing.Config{Deadline: time.Second, Window: time.Second, Ceiling: 100_000, Parallelism: 1})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			end := sizing.Begin(sizer)
			time.Sleep(500 * time.Millisecond)
			end(20_000)
		}
		if b := sizer.Bounds(); b.TailBound != 30_000 || len(fb.resizes) != 0 {
			t.Errorf("tail bound %d, resizes %v; want 30000 and no resize before MinWindows", b.TailBound, fb.resizes)
		}
	})
}

// A negative TailShare turns the guard off: the slow call changes nothing
// before MinWindows.
func TestAutoSizerTailOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 100_000}
		sizer, err := sizing.New(fb, sizing.Config{Deadline: time.Second, Window: time.Second, Ceiling: 100_000, TailShare: -1})
		if err != nil {
			t.Fatal(err)
		}
		end := sizing.Begin(sizer)
		time.Sleep(1500 * time.Millisecond)
		end(1_000)
		if b := sizer.Bounds(); len(fb.resizes) != 0 || b.TailBound != 0 || b.Binding == "tail" {
			t.Errorf("resizes %v, bounds %+v; want none with the guard off", fb.resizes, b)
		}
	})
}

// Busy time is counted per core: a call running alone on a process of 4
// cores counts a quarter of its time, so one caller at a time (a budget
// too small for two messages) measures what 4 at once would do: 1,000
// vertices per 100 ms call is 40k vertices/s either way. Beyond 4 at once
// every busy second counts whole.
func TestAutoSizerCountsBusyTimePerCore(t *testing.T) {
	for _, tt := range []struct {
		callers int
		want    float64
	}{{1, 40_000}, {4, 40_000}, {8, 80_000}} {
		t.Run(strconv.Itoa(tt.callers), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 1_000}
				sizer, err := sizing.New(fb, sizing.Config{
					Deadline: time.Second, Window: time.Second, MinWindows: 1, Parallelism: 4,
				})
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				for range tt.callers {
					wg.Go(func() {
						for range 30 {
							end := sizing.Begin(sizer)
							time.Sleep(100 * time.Millisecond)
							end(1_000)
						}
					})
				}
				wg.Wait()
				b := sizer.Bounds()
				if math.Abs(b.VerticesPerSecond-tt.want) > 1e-6*tt.want {
					t.Errorf("%d callers: %.0f vertices/s, want %.0f", tt.callers, b.VerticesPerSecond, tt.want)
				}
				if want := int64(tt.want / 2); b.DeadlineBound < want-1 || b.DeadlineBound > want {
					t.Errorf("%d callers: deadline bound %d, want %d", tt.callers, b.DeadlineBound, want)
				}
			})
		})
	}
}

func TestNewValidates(t *testing.T) {
	fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 1}
	tests := []struct {
		name string
		cfg  sizing.Config
	}{
		{"no deadline", sizing.Config{}},
		{"negative deadline", sizing.Config{Deadline: -time.Second}},
		{"headroom above 1", sizing.Config{Deadline: time.Second, Headroom: 2}},
		{"negative memory bound", sizing.Config{Deadline: time.Second, MemoryBound: -1}},
		{"negative floor", sizing.Config{Deadline: time.Second, Floor: -1}},
		{"ceiling below floor", sizing.Config{Deadline: time.Second, Floor: 10, Ceiling: 5}},
		{"ceiling defaults to a memory bound below the floor", sizing.Config{Deadline: time.Second, Floor: 10, MemoryBound: 5}},
		{"negative windows", sizing.Config{Deadline: time.Second, Windows: -1}},
		{"hysteresis of 1", sizing.Config{Deadline: time.Second, Hysteresis: 1}},
		{"tail share above 1", sizing.Config{Deadline: time.Second, TailShare: 1.5}},
		{"negative parallelism", sizing.Config{Deadline: time.Second, Parallelism: -2}},
	}
	for _, tt := range tests {
		if _, err := sizing.New(fb, tt.cfg); !errors.Is(err, spillway.ErrInvalidConfig) {
			t.Errorf("%s: error %v, want ErrInvalidConfig", tt.name, err)
		}
		if err := tt.cfg.Validate(); !errors.Is(err, spillway.ErrInvalidConfig) {
			t.Errorf("%s: Validate: %v, want ErrInvalidConfig", tt.name, err)
		}
	}
	minimal := sizing.Config{Deadline: time.Second}
	if err := minimal.Validate(); err != nil {
		t.Errorf("minimal config: Validate: %v", err)
	}
	if _, err := sizing.New(fb, minimal); err != nil {
		t.Errorf("minimal config: %v", err)
	}
	if _, err := sizing.New(nil, minimal); err == nil || !strings.Contains(err.Error(), "budget") {
		t.Errorf("no budget: error %v, want one naming the budget", err)
	}
}

// Validate reports every invalid field, not only the first.
func TestConfigValidateJoinsErrors(t *testing.T) {
	err := sizing.Config{Deadline: time.Second, Headroom: 2, Hysteresis: 1, TailShare: 1.5}.Validate()
	var fields []string
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if fe := (*spillway.FieldError)(nil); errors.As(e, &fe) {
				fields = append(fields, fe.Field)
			}
		}
	}
	if want := []string{"headroom", "hysteresis", "tail_share"}; !slices.Equal(fields, want) {
		t.Errorf("Validate: %v reports %v, want %v", err, fields, want)
	}
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

// saturated runs a backlog that never runs dry through a real budget of
// capacity start with the sizer inside it, on a process of 2 cores: each
// message holds one core (a slot of a channel of 2) for vertices ×
// perVertex, so the process completes 2 / perVertex vertices a second
// however many messages it is given. It returns every resize, with the
// time since the start, and the sizer.
func saturated(t *testing.T, start, vertices int64, perVertex, deadline, until time.Duration) ([]timedResize, *sizing.AutoSizer) {
	t.Helper()
	sh := shape{vertices: int(vertices), perVertex: perVertex}
	return saturatedShift(t, start, sh, sh, deadline, until, until)
}

// saturatedShift is saturated with messages of the shape first until the
// time shift, of the shape later from then on.
func saturatedShift(t *testing.T, start int64, first, later shape, deadline, until, shift time.Duration) ([]timedResize, *sizing.AutoSizer) {
	t.Helper()
	const cores = 2
	vb := mustVertexBudget(start)
	began := time.Now()
	var resizes []timedResize
	sizer, err := sizing.New(vb, sizing.Config{
		Deadline: deadline, Parallelism: cores, Floor: start, Ceiling: 1 << 30,
	}, sizing.WithOnResize(func(_, to int64, b sizing.Bounds) {
		resizes = append(resizes, timedResize{time.Since(began), to, b})
	}))
	if err != nil {
		t.Fatal(err)
	}
	budget, err := middleware.New(vb)
	if err != nil {
		t.Fatal(err)
	}
	slots := make(chan struct{}, cores)
	onACore := func(msg *message.Message) ([]*message.Message, error) {
		slots <- struct{}{}
		defer func() { <-slots }()
		return work(msg)
	}
	// Enough producers to fill any budget the test reaches: the budget,
	// not the traffic, limits what runs at once.
	s := &stream{producers: 64}
	s.shape.Store(&first)
	if shift < until {
		go func() {
			time.Sleep(shift)
			s.shape.Store(&later)
		}()
	}
	s.run(t, withPerVertex(s, budget.Middleware(sizer.Middleware(onACore))), began.Add(until))
	return resizes, sizer
}

type timedResize struct {
	at     time.Duration
	to     int64
	bounds sizing.Bounds
}

// capacityAt returns the capacity the resizes left at time at.
func capacityAt(start int64, resizes []timedResize, at time.Duration) int64 {
	c := start
	for _, r := range resizes {
		if r.at <= at {
			c = r.to
		}
	}
	return c
}

// Issue 36: started from the smallest budget (one message, so the cores
// are half idle), the sizer used to wait MinWindows windows before any
// resize, and its tail guard read a message that ran alone on one of two
// cores as twice as slow as it is in a full budget. Now it grows while the
// budget starves the cores and reads such a call per core: the cores are
// all busy within the first window.
//
// It then settles at the knee, not at the deadline bound: two messages
// keep both cores busy, and a larger budget only makes messages wait for
// a core. After MinWindows windows the budget tries the deadline bound
// for MinWindows more, finds the throughput no higher, and goes back to
// two messages, where the throughput binds.
//
// 1000-vertex messages at 100 µs a vertex on 2 cores: 20k vertices/s,
// a deadline bound of 10k at a deadline of 1 s (the window).
func TestAutoSizerConvergesFromTheFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			window = time.Second
			bound  = 10_000
			knee   = 2_000
		)
		resizes, sizer := saturated(t, 1000, 1000, 100*time.Microsecond, window, 10*window)
		for _, r := range resizes {
			t.Logf("at %v: %d, %s binds (%+v)", r.at, r.to, r.bounds.Binding, r.bounds)
		}
		if c := capacityAt(1000, resizes, window); c < knee {
			t.Errorf("capacity %d after the first window, want at least %d: two messages, one per core", c, knee)
		}
		for _, r := range resizes {
			if r.to > bound {
				t.Errorf("resized to %d at %v: above the deadline bound %d", r.to, r.at, bound)
			}
		}
		var last timedResize
		for _, r := range resizes {
			if r.at <= 6*window+200*time.Millisecond {
				last = r
			}
		}
		b := last.bounds
		if last.to != knee || b.Binding != "throughput" || b.DeadlineBound < bound*99/100 || b.DeadlineBound > bound {
			t.Errorf("after 6 windows: %+v, want the throughput to bind at %d below the deadline bound of about %d", last, knee, bound)
		}
		// It tries the deadline bound again Windows windows later.
		if c := capacityAt(1000, resizes, 10*window+200*time.Millisecond); c != knee {
			t.Errorf("capacity %d after 10 windows, want %d", c, knee)
		}
		if b := sizer.Bounds(); b.Budget > bound {
			t.Errorf("bounds %+v at the end", b)
		}
	})
}

// The knee is no floor: when the handler slows, the deadline bound falls
// below it and the budget follows. 100 µs a vertex for 7 windows (the knee
// of 2000, as above), then 750 µs: 2667 vertices/s on 2 cores, a deadline
// bound of 1333.
func TestAutoSizerShrinksBelowTheKnee(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const window = time.Second
		resizes, sizer := saturatedShift(t, 1000, shape{vertices: 1000, perVertex: 100 * time.Microsecond},
			shape{vertices: 1000, perVertex: 750 * time.Microsecond}, window, 16*window, 7*window)
		for _, r := range resizes {
			t.Logf("at %v: %d, %s binds", r.at, r.to, r.bounds.Binding)
		}
		if c := capacityAt(1000, resizes, 7*window); c != 2_000 {
			t.Fatalf("capacity %d before the handler slowed, want the knee of 2000", c)
		}
		if b := sizer.Bounds(); b.Binding != "deadline" || b.Budget < 1_300 || b.Budget > 1_340 {
			t.Errorf("bounds %+v after the handler slowed, want the deadline bound of about 1333 to bind", b)
		}
	})
}

// A growth that raises the throughput is followed by more: a handler that
// waits (on a downstream, say) completes more the more calls run, so the
// budget keeps growing to its ceiling. 1000-vertex messages that each
// take 100 ms however many run: 10k vertices/s per message in flight.
func TestAutoSizerGrowsWhileThroughputRises(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ceiling = 40_000
		vb := mustVertexBudget(2_000)
		sizer, err := sizing.New(vb, sizing.Config{
			Deadline: time.Second, Parallelism: 2, Floor: 2_000, Ceiling: ceiling,
		})
		if err != nil {
			t.Fatal(err)
		}
		budget, err := middleware.New(vb)
		if err != nil {
			t.Fatal(err)
		}
		s := &stream{producers: 64}
		s.shape.Store(&shape{vertices: 1000, perVertex: 100 * time.Microsecond})
		s.run(t, withPerVertex(s, budget.Middleware(sizer.Middleware(work))), time.Now().Add(15*time.Second))
		if b := sizer.Bounds(); vb.Capacity() != ceiling || b.Binding == "throughput" {
			t.Errorf("capacity %d, bounds %+v; want the ceiling of %d", vb.Capacity(), b, ceiling)
		}
	})
}

// A message larger than the budget was clamped and runs alone, so the
// budget starves the cores for as long as it runs: the sizer grows it when
// such a message starts instead of when it completes. Five light calls
// (100 vertices in 10 ms on one of 2 cores: 20k vertices/s, a deadline
// bound of 10k) leave the budget of 1000 alone; a 2000-vertex call that
// starts alone grows it to 4000, two such calls at once, as it starts.
func TestAutoSizerGrowsWhenAMessageRunsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &fakeBudget{t: t, floor: 1, ceiling: 1 << 40, cap: 1_000}
		sizer, err := sizing.New(fb, sizing.Config{Deadline: time.Second, Window: time.Second, Parallelism: 2})
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			end := sizing.BeginCharged(sizer, 100)
			time.Sleep(10 * time.Millisecond)
			end(100)
		}
		if len(fb.resizes) != 0 {
			t.Fatalf("resizes %v after light calls that fit, want none", fb.resizes)
		}
		end := sizing.BeginCharged(sizer, 2_000)
		if c := fb.Capacity(); c != 4_000 {
			t.Errorf("capacity %d as a 2000-vertex call starts alone, want 4000", c)
		}
		time.Sleep(200 * time.Millisecond)
		end(2_000)
		if len(fb.resizes) == 0 || fb.resizes[0] != 4_000 {
			t.Errorf("resizes %v, want the first to 4000", fb.resizes)
		}
	})
}

// The growth before MinWindows never passes the deadline bound of what was
// measured so far. 1000-vertex messages at 750 µs a vertex on 2 cores:
// 2667 vertices/s, a deadline bound of 1333 at a deadline of 1 s. Two
// messages at once would keep both cores busy, but the budget stops at
// the deadline bound, where one runs at a time.
func TestAutoSizerRampStopsAtTheDeadlineBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ideal = 1_333
		resizes, _ := saturated(t, 1000, 1000, 750*time.Microsecond, time.Second, 6*time.Second)
		if len(resizes) == 0 {
			t.Fatal("no resize, want a grow to the deadline bound of 1333")
		}
		for _, r := range resizes {
			t.Logf("at %v: %d, %s binds", r.at, r.to, r.bounds.Binding)
			if r.to > ideal {
				t.Errorf("resized to %d at %v: above the deadline bound %d", r.to, r.at, ideal)
			}
		}
		if first := resizes[0]; first.to < ideal*9/10 || first.at > time.Second || first.bounds.Binding != "deadline" {
			t.Errorf("first resize %+v, want one to about %d, bound by the deadline, at the first completion", first, ideal)
		}
	})
}
