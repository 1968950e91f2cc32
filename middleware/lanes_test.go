package middleware

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-go/spillway"
)

func mustLanes(t *testing.T, capacity int64, lanes ...Lane) *VertexBudget {
	t.Helper()
	b, err := NewVertexBudget(capacity, WithLanes(lanes...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func laneStat(b *VertexBudget, name string) BudgetStats {
	for _, s := range b.Lanes() {
		if s.Name == name {
			return s
		}
	}
	panic("no lane " + name)
}

// acquireIn admits a charge in the named lane, as the middleware does.
func acquireIn(ctx context.Context, b *VertexBudget, name string, v int64) (Permit, error) {
	for i := range b.lanes {
		if b.lanes[i].name == name {
			return b.acquire(ctx, i, v, 1, nil)
		}
	}
	panic("no lane " + name)
}

func TestLanesDefaultIsOneLane(t *testing.T) {
	b := mustVertexBudget(100)
	ls := b.Lanes()
	if len(ls) != 1 || ls[0].Name != "default" || ls[0].Capacity != 100 {
		t.Fatalf("lanes = %+v", ls)
	}
	p := mustAcquire(t, b, 30)
	if ls := b.Lanes(); ls[0].InUse != 30 || ls[0].Admitted != 1 || ls[0].AdmittedVertices != 30 {
		t.Fatalf("lanes = %+v", ls)
	}
	p.Release()
	// One lane given explicitly is the plain budget too.
	b = mustLanes(t, 100, Lane{Name: "all"})
	if len(b.lanes) != 1 || b.Lanes()[0].Name != "all" {
		t.Fatalf("lanes = %+v", b.Lanes())
	}
}

func TestLanesValidate(t *testing.T) {
	for _, tt := range []struct {
		lanes []Lane
		field string
	}{
		{[]Lane{{Name: ""}}, "lanes[0].name"},
		{[]Lane{{Name: "a"}, {Name: "a"}}, "lanes[1].name"},
		{[]Lane{{Name: "a", Weight: -1}}, "lanes[0].weight"},
		{[]Lane{{Name: "a", Reserve: 1}}, "lanes[0].reserve"},
		{[]Lane{{Name: "a", Reserve: -0.1}}, "lanes[0].reserve"},
		{[]Lane{{Name: "a", Reserve: 0.6}, {Name: "b", Reserve: 0.4}}, "lanes[1].reserve"},
		{[]Lane{{Name: "a", MaxCharge: -1}}, "lanes[0].max_charge"},
		{make([]Lane, maxLanes+1), "lanes"},
	} {
		b, err := NewVertexBudget(100, WithLanes(tt.lanes...))
		var fe *spillway.FieldError
		if b != nil || !errors.Is(err, spillway.ErrInvalidConfig) || !errors.As(err, &fe) || fe.Field != tt.field {
			t.Errorf("%d lanes %.200v: %v, %v; want a FieldError on %s", len(tt.lanes), tt.lanes, b, err, tt.field)
		}
	}
}

// A Permit packs its vertices, lane and clamping into one word: each reads
// back as granted at the extremes.
func TestPermitPacking(t *testing.T) {
	b := mustVertexBudget(maxCapacity)
	for _, tt := range []struct {
		v       int64
		lane    int
		clamped bool
	}{
		{0, 0, false},
		{maxCapacity, 0, true},
		{maxCapacity, maxLanes - 1, false},
		{1, maxLanes - 1, true},
	} {
		p := b.permit(tt.v, 7, tt.lane, tt.clamped, time.Second)
		if p.vertices() != tt.v || p.lane() != tt.lane || p.clamped() != tt.clamped || p.messages != 7 || p.wait != time.Second {
			t.Errorf("permit(%d, lane %d, clamped %v) reads back %d, lane %d, clamped %v, %d messages, wait %v",
				tt.v, tt.lane, tt.clamped, p.vertices(), p.lane(), p.clamped(), p.messages, p.wait)
		}
	}
}

func TestLaneSelection(t *testing.T) {
	b := mustLanes(t, 1000,
		Lane{Name: "positions", Handlers: []string{"pos"}},
		Lane{Name: "alerts", Topics: []string{"alerts"}, MaxCharge: 50},
		Lane{Name: "light", MaxCharge: 100},
		Lane{Name: "heavy"})
	for _, tt := range []struct {
		handler, topic string
		v              int64
		want           string
	}{
		{"pos", "x", 5000, "positions"},
		{"h", "alerts", 10, "alerts"},
		{"h", "alerts", 60, "light"},
		{"h", "t", 99, "light"},
		{"h", "t", 100, "heavy"},
		{"", "", 5, "light"},
	} {
		if got := b.lanes[b.laneFor(tt.handler, tt.topic, tt.v)].name; got != tt.want {
			t.Errorf("laneFor(%q, %q, %d) = %s, want %s", tt.handler, tt.topic, tt.v, got, tt.want)
		}
	}
	// Acquire selects by charge.
	p := mustAcquire(t, b, 10)
	q := mustAcquire(t, b, 500)
	if laneStat(b, "light").InUse != 10 || laneStat(b, "heavy").InUse != 500 {
		t.Fatalf("lanes = %+v", b.Lanes())
	}
	p.Release()
	q.Release()
}

// The light lane within its reservation is admitted at once while the
// heavy lane holds everything else and has a waiter; past its reservation
// it waits like anyone.
func TestLaneReservationHonoured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustLanes(t, 1000, Lane{Name: "light", MaxCharge: 101, Reserve: 0.1}, Lane{Name: "heavy"})
		held := mustAcquire(t, b, 5000) // clamped to the heavy ceiling, 900
		if !held.clamped() || held.vertices() != 900 {
			t.Fatalf("heavy permit %+v, want clamped to 900", held)
		}
		go func() { mustAcquire(t, b, 500).Release() }()
		synctest.Wait()
		if s := laneStat(b, "heavy"); s.Waiting != 1 || s.SaturatedFor == 0 {
			t.Fatalf("heavy lane %+v, want one waiter and saturated", s)
		}
		if d := laneStat(b, "light").SaturatedFor; d != 0 {
			t.Fatalf("light lane saturated for %v while within its reservation", d)
		}
		p1 := mustAcquire(t, b, 50)
		p2 := mustAcquire(t, b, 50)
		if s := laneStat(b, "light"); s.InUse != 100 || s.TotalWait != 0 {
			t.Fatalf("light lane %+v, want 100 in use, no wait", s)
		}
		if b.Stats().InUse != 1000 {
			t.Fatalf("in use %d, want 1000", b.Stats().InUse)
		}
		got := make(chan struct{})
		go func() { mustAcquire(t, b, 50).Release(); close(got) }()
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("light lane admitted beyond its reservation on a full budget")
		default:
		}
		p1.Release()
		<-got // the light waiter takes the reservation back
		p2.Release()
		held.Release()
		synctest.Wait()
		if s := b.Stats(); s.InUse != 0 || s.Waiting != 0 {
			t.Fatalf("leftover %+v", s)
		}
	})
}

// An idle lane's share is borrowed: alone, a lane takes all the capacity
// but the other lanes' reservations.
func TestLaneBorrowing(t *testing.T) {
	b := mustLanes(t, 1000, Lane{Name: "a", MaxCharge: 101}, Lane{Name: "b", Weight: 3})
	var ps []Permit
	for range 10 {
		ps = append(ps, mustAcquire(t, b, 100)) // lane a, weight 1 of 4
	}
	if laneStat(b, "a").InUse != 1000 {
		t.Fatalf("lane a holds %d, want the whole budget", laneStat(b, "a").InUse)
	}
	for _, p := range ps {
		p.Release()
	}
	r := mustLanes(t, 1000, Lane{Name: "a", MaxCharge: 101, Reserve: 0.25}, Lane{Name: "b"})
	p := mustAcquire(t, r, 2000)
	if p.vertices() != 750 || !p.clamped() {
		t.Fatalf("lane b alone got %d, want 750 (all but a's reservation)", p.vertices())
	}
	if _, ok := r.tryAcquire(500); ok {
		t.Fatal("lane b took lane a's reservation")
	}
	q, ok := r.tryAcquire(100)
	if !ok {
		t.Fatal("lane a could not take its reservation")
	}
	q.Release()
	p.Release()
}

// With both lanes always waiting, admissions alternate by weight: the lane
// below its share goes first.
func TestLaneWeightedOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustLanes(t, 100, Lane{Name: "a", Weight: 1}, Lane{Name: "b", Weight: 3})
		held, _ := acquireIn(t.Context(), b, "a", 100)
		var mu sync.Mutex
		var order []string
		gate := make(chan struct{})
		for i := range 16 {
			name := []string{"a", "b"}[i%2]
			go func() {
				p, err := acquireIn(t.Context(), b, name, 100)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				<-gate
				p.Release()
			}()
			synctest.Wait() // queue in a known order
		}
		held.Release()
		for range 16 {
			synctest.Wait()
			gate <- struct{}{}
		}
		synctest.Wait()
		// a's head queued first and wins the tie at zero; then b is
		// below its share three times for each of a's (ties go to the
		// earlier head), until b's eight waiters are done.
		want := "abbbabbbabbaaaaa"
		got := ""
		for _, s := range order {
			got += s
		}
		if got != want {
			t.Fatalf("order %s, want %s", got, want)
		}
	})
}

// Over a long mixed run with both lanes always waiting, each lane's share
// of the admitted vertices is its weight's share, within 10 %.
func TestLaneFairnessLongRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const capacity = 10_000
		b := mustLanes(t, capacity, Lane{Name: "a", Weight: 1}, Lane{Name: "b", Weight: 3})
		ctx, stop := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for i := range 16 {
			name := []string{"a", "b"}[i%2]
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			wg.Go(func() {
				for ctx.Err() == nil {
					// Mixed charges: pings, polygons, heavy ones.
					v := []int64{10, 300, 2_000, 6_000}[rng.IntN(4)]
					p, err := acquireIn(ctx, b, name, v)
					if err != nil {
						return
					}
					time.Sleep(time.Duration(v+rng.Int64N(200)) * 10 * time.Microsecond)
					p.Release()
				}
			})
		}
		time.Sleep(10 * time.Second)
		a0, b0 := laneStat(b, "a").AdmittedVertices, laneStat(b, "b").AdmittedVertices
		time.Sleep(3 * time.Minute)
		a1, b1 := laneStat(b, "a").AdmittedVertices, laneStat(b, "b").AdmittedVertices
		stop()
		wg.Wait()
		share := float64(b1-b0) / float64((a1-a0)+(b1-b0))
		if share < 0.75*0.9 || share > 0.75*1.1 {
			t.Fatalf("lane b's share of vertices = %.3f, want 0.75 ± 10 %% (a %d, b %d)", share, a1-a0, b1-b0)
		}
		if s := b.Stats(); s.PeakInUse > capacity || s.InUse != 0 {
			t.Fatalf("stats %+v", s)
		}
		t.Logf("b's share %.3f over %d vertices", share, (a1-a0)+(b1-b0))
	})
}

// A heavy waiter is admitted whatever the stream of light work: the light
// lane is admitted at most the documented bound ahead of it, and its wait
// ends once the light work admitted before it drains.
func TestLaneStarvationBound(t *testing.T) {
	for _, reserve := range []float64{0, 0.2} {
		synctest.Test(t, func(t *testing.T) {
			const capacity, light = 1000, 100
			b := mustLanes(t, capacity, Lane{Name: "light", MaxCharge: light + 1, Reserve: reserve}, Lane{Name: "heavy"})
			ctx, stop := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			for range 12 {
				wg.Go(func() {
					for ctx.Err() == nil {
						p, err := b.Acquire(ctx, light)
						if err != nil {
							return
						}
						time.Sleep(time.Millisecond)
						p.Release()
					}
				})
			}
			time.Sleep(time.Second)
			for round := range 20 {
				synctest.Wait()
				before := laneStat(b, "light").AdmittedVertices
				r := capacity - laneStat(b, "heavy").Capacity // light's reservation
				var during uint64
				var wait time.Duration
				start := time.Now()
				p := mustAcquire(t, b, capacity) // heavy, clamped to its ceiling
				wait = time.Since(start)
				during = laneStat(b, "light").AdmittedVertices - before
				// C_light = 100, C_heavy = ceiling, weights 1: S = ceiling,
				// bound = 1·S + C_light from the shared budget; what the
				// light lane takes of its own reservation comes on top,
				// at most r per light hold time (1 ms) of the wait.
				ceiling := uint64(capacity) - uint64(r)
				bound := ceiling + light + uint64(r)*uint64(wait/time.Millisecond+1)
				if during > bound {
					t.Fatalf("reserve %g, round %d: light lane admitted %d vertices ahead of the heavy waiter, bound %d", reserve, round, during, bound)
				}
				if wait > 3*time.Millisecond {
					t.Fatalf("reserve %g, round %d: heavy waiter waited %v, want at most 3 light hold times", reserve, round, wait)
				}
				time.Sleep(time.Millisecond)
				p.Release()
				time.Sleep(5 * time.Millisecond)
			}
			stop()
			wg.Wait()
			if s := b.Stats(); s.PeakInUse > capacity || s.InUse != 0 || s.Waiting != 0 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// Resize keeps reservations as shares, admits waiters that now fit, and
// cancellation refunds in every lane.
func TestLanesResizeAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustLanes(t, 1000, Lane{Name: "light", MaxCharge: 101, Reserve: 0.1}, Lane{Name: "heavy"})
		held := mustAcquire(t, b, 900)
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			_, err := b.Acquire(ctx, 900)
			errc <- err
		}()
		got := make(chan Permit, 1)
		go func() { got <- mustAcquire(t, b, 800) }()
		synctest.Wait()
		if s := laneStat(b, "heavy"); s.Waiting != 2 {
			t.Fatalf("heavy %+v", s)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v", err)
		}
		if err := b.Resize(2000); err != nil {
			t.Fatal(err)
		}
		p := <-got
		if s := laneStat(b, "heavy"); s.Capacity != 1800 {
			t.Fatalf("heavy ceiling %d after growing to 2000, want 1800 (light reserves 200)", s.Capacity)
		}
		if s := b.Stats(); s.InUse != 1700 || s.Waiting != 0 {
			t.Fatalf("stats %+v", s)
		}
		p.Release()
		held.Release()
		if err := b.Resize(500); err != nil {
			t.Fatal(err)
		}
		if s := laneStat(b, "heavy"); s.Capacity != 450 || s.InUse != 0 {
			t.Fatalf("light %+v", s)
		}
		for _, s := range b.Lanes() {
			if s.InUse != 0 || s.Waiting != 0 || s.WaitingVertices != 0 {
				t.Fatalf("lane %+v not back to zero", s)
			}
		}
	})
}

// Concurrent lanes with cancellation and resizing never exceed the capacity
// and always refund (run with -race).
func TestLanesStress(t *testing.T) {
	b := mustLanes(t, 5000, Lane{Name: "light", MaxCharge: 200, Reserve: 0.1, Weight: 2},
		Lane{Name: "mid", MaxCharge: 2000, Reserve: 0.2}, Lane{Name: "heavy"})
	ctx, stop := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer stop()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var overs int
	for i := range 12 {
		rng := rand.New(rand.NewPCG(uint64(i), 11))
		wg.Go(func() {
			for ctx.Err() == nil {
				wctx, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(3000))*time.Microsecond)
				p, err := b.Acquire(wctx, []int64{50, 150, 1500, 4000, 9000}[rng.IntN(5)])
				cancel()
				if err != nil {
					continue
				}
				if s := b.Stats(); s.InUse > s.Capacity {
					mu.Lock()
					overs++
					mu.Unlock()
				}
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				p.Release()
			}
		})
	}
	wg.Go(func() {
		// Growing only: a shrink may leave admitted work above the
		// new capacity, by design.
		for n := int64(1); ctx.Err() == nil; n++ {
			_ = b.Resize(5000 + 10*n)
			time.Sleep(2 * time.Millisecond)
		}
	})
	wg.Wait()
	if overs != 0 {
		t.Fatalf("in use above the capacity %d times", overs)
	}
	for _, s := range b.Lanes() {
		if s.InUse != 0 || s.Waiting != 0 {
			t.Fatalf("lane %+v not back to zero", s)
		}
	}
	if s := b.Stats(); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A lane's snapshot has the same figures as the budget's, for the lane: its
// ceiling, its peak, its clamped charges, its oldest waiter, its waits and
// its saturation; the budget's snapshot sums the lanes.
func TestLaneStatsFigures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustLanes(t, 1000, Lane{Name: "light", MaxCharge: 101, Reserve: 0.2}, Lane{Name: "heavy"})
		l1 := mustAcquire(t, b, 100)
		l2 := mustAcquire(t, b, 100) // the light lane's peak: 200
		l1.Release()
		heavy := mustAcquire(t, b, 5000) // clamped to the heavy ceiling, 800
		go func() { mustAcquire(t, b, 300).Release() }()
		synctest.Wait()
		time.Sleep(3 * time.Second)

		light, hv := laneStat(b, "light"), laneStat(b, "heavy")
		if light.Capacity != 1000 || light.PeakInUse != 200 || light.InUse != 100 || light.Clamped != 0 ||
			light.Admitted != 2 || light.AdmittedVertices != 200 || light.Waiting != 0 || light.SaturatedFor != 0 {
			t.Errorf("light lane %+v", light)
		}
		if hv.Capacity != 800 || hv.PeakInUse != 800 || hv.Clamped != 1 || hv.Waiting != 1 || hv.WaitingVertices != 300 ||
			hv.OldestWait != 3*time.Second || hv.SaturatedFor != 3*time.Second {
			t.Errorf("heavy lane %+v", hv)
		}
		if s := b.Stats(); s.Name != "" || s.Admitted != 3 || s.AdmittedVertices != 1000 || s.Clamped != 1 ||
			s.OldestWait != 3*time.Second || s.SaturatedFor != 3*time.Second {
			t.Errorf("budget %+v", s)
		}

		heavy.Release()
		synctest.Wait()
		l2.Release()
		if hv := laneStat(b, "heavy"); hv.TotalWait != 3*time.Second || hv.Admitted != 2 || hv.OldestWait != 0 {
			t.Errorf("heavy lane after its waiter ran %+v", hv)
		}
		if s := b.Stats(); s.TotalWait != 3*time.Second || s.InUse != 0 {
			t.Errorf("budget after %+v", s)
		}
	})
}
