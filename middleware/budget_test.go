package middleware

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor polls cond until it holds or the test's patience runs out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func mustAcquire(t *testing.T, b *VertexBudget, n int64) Permit {
	t.Helper()
	p, err := b.Acquire(context.Background(), n)
	if err != nil {
		t.Fatalf("Acquire(%d): %v", n, err)
	}
	return p
}

func TestAcquireRelease(t *testing.T) {
	b := mustVertexBudget(100)
	p := mustAcquire(t, b, 30)
	q := mustAcquire(t, b, 70)
	if got := b.Stats().InUse; got != 100 {
		t.Fatalf("InUse = %d, want 100", got)
	}
	if b.Stats().SaturatedFor == 0 {
		t.Fatal("a full budget must report saturation")
	}
	if _, ok := b.tryAcquire(1); ok {
		t.Fatal("TryAcquire succeeded on a full budget")
	}
	p.Release()
	if b.Stats().SaturatedFor > 0 {
		t.Fatal("saturation must clear once there is room and nobody waits")
	}
	b.release(q)
	if got := b.Stats().InUse; got != 0 {
		t.Fatalf("InUse after release = %d, want 0", got)
	}
	s := b.Stats()
	if s.Admitted != 2 || s.PeakInUse != 100 || s.TotalWait != 0 {
		t.Fatalf("stats = %+v", s)
	}
	Permit{}.Release() // the zero permit is a no-op
}

func TestNewVertexBudgetRejectsNonPositive(t *testing.T) {
	for _, c := range []int64{0, -1} {
		b, err := NewVertexBudget(c)
		var fe *spillway.FieldError
		if b != nil || !errors.Is(err, spillway.ErrInvalidConfig) || !errors.As(err, &fe) || fe.Field != "capacity" {
			t.Errorf("NewVertexBudget(%d) = %v, %v; want nil and a FieldError on capacity", c, b, err)
		}
	}
	if err := mustVertexBudget(1).Resize(0); err == nil {
		t.Error("Resize(0) returned nil error")
	}
}

func TestNegativeCost(t *testing.T) {
	b := mustVertexBudget(10)
	if _, err := b.Acquire(context.Background(), -1); !errors.Is(err, errNegativeCost) {
		t.Fatalf("Acquire(-1) err = %v, want errNegativeCost", err)
	}
	if _, err := b.acquire(context.Background(), 0, 1, -1, nil); !errors.Is(err, errNegativeCost) {
		t.Fatalf("AcquireN(1,-1) err = %v, want errNegativeCost", err)
	}
	if _, ok := b.tryAcquire(-5); ok {
		t.Fatal("TryAcquire(-5) succeeded")
	}
	if b.Stats().InUse != 0 {
		t.Fatal("a rejected charge was held")
	}
}

func TestOverReleasePanics(t *testing.T) {
	b := mustVertexBudget(10)
	p := mustAcquire(t, b, 5)
	p.Release()
	defer func() {
		if recover() == nil {
			t.Fatal("releasing a permit twice did not panic")
		}
		// The budget is still usable after the panic.
		if _, ok := b.tryAcquire(10); !ok {
			t.Fatal("budget unusable after an over-release panic")
		}
	}()
	p.Release()
}

func TestReleaseForeignPermitPanics(t *testing.T) {
	a, b := mustVertexBudget(10), mustVertexBudget(10)
	p := mustAcquire(t, a, 1)
	defer func() {
		if recover() == nil {
			t.Fatal("releasing another budget's permit did not panic")
		}
	}()
	b.release(p)
}

// An oversized charge is clamped to the capacity: it waits for the budget to
// drain, then runs alone, and never deadlocks.
func TestClampRunsAlone(t *testing.T) {
	b := mustVertexBudget(40_000)
	small := mustAcquire(t, b, 1_000)

	got := make(chan Permit)
	go func() {
		p, err := b.Acquire(context.Background(), 41_000)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitFor(t, "the oversized charge to queue", func() bool { return b.Stats().Waiting == 1 })
	small.Release()

	var big Permit
	select {
	case big = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("oversized charge deadlocked")
	}
	if !big.clamped() || big.vertices() != 40_000 {
		t.Fatalf("permit = %+v, want clamped to 40000", big)
	}
	if _, ok := b.tryAcquire(1); ok {
		t.Fatal("a clamped charge must run alone")
	}
	big.Release()
	if b.Stats().InUse != 0 || b.Stats().Clamped != 1 {
		t.Fatalf("after release: %+v", b.Stats())
	}
}

// A large waiter at the head of the queue is admitted before any small
// charge that arrived after it, even though the small ones would fit.
func TestFIFOOrder(t *testing.T) {
	b := mustVertexBudget(100)
	held := mustAcquire(t, b, 10)

	order := make(chan string, 3)
	go func() {
		p := mustAcquire(t, b, 100)
		order <- "large"
		time.Sleep(10 * time.Millisecond)
		p.Release()
	}()
	waitFor(t, "large to queue", func() bool { return b.Stats().Waiting == 1 })
	if _, ok := b.tryAcquire(1); ok {
		t.Fatal("TryAcquire jumped the queue")
	}
	go func() {
		p := mustAcquire(t, b, 1)
		order <- "small"
		p.Release()
	}()
	waitFor(t, "small to queue", func() bool { return b.Stats().Waiting == 2 })
	held.Release()

	if first, second := <-order, <-order; first != "large" || second != "small" {
		t.Fatalf("admission order = %s, %s; want large, small", first, second)
	}
}

// Starvation: a steady stream of small charges that always overlap must not
// keep a large waiter out.
func TestLargeWaiterNotStarved(t *testing.T) {
	b := mustVertexBudget(1_000)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				p, err := b.Acquire(ctx, 200)
				if err != nil {
					return
				}
				time.Sleep(200 * time.Microsecond)
				p.Release()
			}
		}()
	}
	waitFor(t, "small traffic to saturate", func() bool { return b.Stats().InUse >= 800 })

	done := make(chan struct{})
	go func() {
		p := mustAcquire(t, b, 1_000)
		p.Release()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("large waiter starved by small charges")
	}
	stop()
	wg.Wait()
	if b.Stats().InUse != 0 || b.Stats().Waiting != 0 {
		t.Fatalf("leftover state: %+v", b.Stats())
	}
}

// Cancelling a waiter returns ctx.Err() unchanged, holds nothing, and frees
// the queue for the waiters behind it.
func TestCancelWhileWaiting(t *testing.T) {
	b := mustVertexBudget(100)
	held := mustAcquire(t, b, 50)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, 100) // head waiter, cannot fit while held
		errc <- err
	}()
	waitFor(t, "large to queue", func() bool { return b.Stats().Waiting == 1 })

	smallDone := make(chan struct{})
	go func() {
		p := mustAcquire(t, b, 10) // fits, but queued behind large
		p.Release()
		close(smallDone)
	}()
	waitFor(t, "small to queue", func() bool { return b.Stats().Waiting == 2 })

	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("err = %v, want context.Canceled unchanged", err)
	}
	select {
	case <-smallDone:
	case <-time.After(5 * time.Second):
		t.Fatal("removing the head waiter did not admit the one behind it")
	}
	if b.Stats().InUse != 50 || b.Stats().Waiting != 0 {
		t.Fatalf("after cancel: %+v", b.Stats())
	}
	held.Release()
	if s := b.Stats(); s.InUse != 0 || b.cancelled != 1 {
		t.Fatalf("final: %+v", s)
	}
}

func TestAcquireOnDoneContext(t *testing.T) {
	b := mustVertexBudget(10)
	held := mustAcquire(t, b, 10)
	defer held.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	if _, err := b.Acquire(ctx, 1); err != context.DeadlineExceeded {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if b.Stats().Waiting != 0 {
		t.Fatal("a done context left a waiter behind")
	}
}

// Grants racing with cancellation must never leak a charge.
func TestGrantCancelRace(t *testing.T) {
	b := mustVertexBudget(50)
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	for i := range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*50*time.Microsecond)
			defer cancel()
			p, err := b.Acquire(ctx, int64(1+i%60))
			if err != nil {
				failed.Add(1)
				return
			}
			ok.Add(1)
			time.Sleep(20 * time.Microsecond)
			p.Release()
		}()
	}
	wg.Wait()
	s := b.Stats()
	if s.InUse != 0 || b.inUseMsgs != 0 || s.Waiting != 0 || s.SaturatedFor > 0 {
		t.Fatalf("leaked state after race: %+v", s)
	}
	if ok.Load()+failed.Load() != 400 || ok.Load() == 0 {
		t.Fatalf("ok=%d failed=%d", ok.Load(), failed.Load())
	}
}

// With 500 concurrent charges of mixed cost the budget is never exceeded,
// except by one clamped charge that then runs alone.
func TestPeakNeverExceedsCapacity(t *testing.T) {
	const capacity = 10_000
	b := mustVertexBudget(capacity)
	var (
		mu      sync.Mutex
		inUse   int64
		holders int
		peak    int64
		bad     string
	)
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		c := int64(1 + rng.IntN(3000))
		if i%50 == 0 {
			c = 25_000 // oversized
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := mustAcquire(t, b, c)
			mu.Lock()
			inUse += p.vertices()
			holders++
			peak = max(peak, inUse)
			if inUse > capacity {
				bad = "in use exceeded capacity"
			}
			if p.clamped() && holders != 1 {
				bad = "clamped charge did not run alone"
			}
			mu.Unlock()
			time.Sleep(time.Duration(c%500) * time.Microsecond)
			mu.Lock()
			inUse -= p.vertices()
			holders--
			mu.Unlock()
			p.Release()
		}()
	}
	wg.Wait()
	if bad != "" {
		t.Fatal(bad)
	}
	s := b.Stats()
	if s.PeakInUse > capacity || s.InUse != 0 || s.Admitted != 500 || s.Clamped != 10 {
		t.Fatalf("stats = %+v (observed peak %d)", s, peak)
	}
}

func TestMessageLimit(t *testing.T) {
	b := mustVertexBudget(1_000, WithMessageLimit(2))
	p1 := mustAcquire(t, b, 1)
	p2 := mustAcquire(t, b, 1)
	if b.Stats().SaturatedFor == 0 {
		t.Fatal("message limit reached but not saturated")
	}
	if _, ok := b.tryAcquire(1); ok {
		t.Fatal("third message admitted past a limit of 2")
	}
	// A zero-message charge is bounded only by vertices.
	p0, err := b.acquire(context.Background(), 0, 10, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	p0.Release()
	got := make(chan struct{})
	go func() {
		p := mustAcquire(t, b, 1)
		p.Release()
		close(got)
	}()
	waitFor(t, "third message to queue", func() bool { return b.Stats().Waiting == 1 })
	p1.Release()
	<-got
	p2.Release()
	if s := b.Stats(); b.inUseMsgs != 0 || s.InUse != 0 || b.messageLimit != 2 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestResize(t *testing.T) {
	b := mustVertexBudget(100)
	held := mustAcquire(t, b, 80)
	got := make(chan Permit)
	go func() { got <- mustAcquire(t, b, 50) }()
	waitFor(t, "waiter", func() bool { return b.Stats().Waiting == 1 })
	if s := b.Stats(); s.WaitingVertices != 50 {
		t.Fatalf("WaitingVertices = %d", s.WaitingVertices)
	}

	if err := b.Resize(130); err != nil {
		t.Fatal(err)
	}
	p := <-got // growing admitted the waiter
	if b.Stats().InUse != 130 {
		t.Fatalf("InUse = %d, want 130", b.Stats().InUse)
	}

	// Shrinking never revokes: 130 stay in use against a capacity of 60.
	if err := b.Resize(60); err != nil {
		t.Fatal(err)
	}
	if b.Stats().InUse != 130 || b.Capacity() != 60 || b.Stats().SaturatedFor == 0 {
		t.Fatalf("after shrink: %+v", b.Stats())
	}
	held.Release()
	if _, ok := b.tryAcquire(20); ok {
		t.Fatal("admitted while still above the shrunken capacity")
	}
	p.Release()
	q, ok := b.tryAcquire(60)
	if !ok {
		t.Fatal("a drained budget refused a charge of its capacity")
	}
	q.Release()
}

func TestSaturatedFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustVertexBudget(10)
		if b.SaturatedFor() != 0 || b.Stats().SaturatedFor > 0 {
			t.Fatal("fresh budget saturated")
		}
		p := mustAcquire(t, b, 10)
		time.Sleep(30 * time.Second)
		if got := b.SaturatedFor(); got != 30*time.Second {
			t.Fatalf("SaturatedFor = %v, want 30s", got)
		}
		// A waiter keeps it saturated across a release that admits it.
		done := make(chan struct{})
		go func() {
			q := mustAcquire(t, b, 10)
			time.Sleep(5 * time.Second)
			q.Release()
			close(done)
		}()
		synctest.Wait()
		time.Sleep(2 * time.Second)
		p.Release()
		time.Sleep(time.Second)
		if got := b.SaturatedFor(); got != 33*time.Second {
			t.Fatalf("SaturatedFor = %v, want 33s (saturation unbroken)", got)
		}
		<-done
		if b.SaturatedFor() != 0 || b.Stats().SaturatedFor > 0 {
			t.Fatal("saturation did not clear")
		}
		if s := b.Stats(); s.TotalWait != 2*time.Second || s.SaturatedFor != 0 {
			t.Fatalf("wait stats = %+v", s)
		}
	})
}

func TestStatsOldestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustVertexBudget(10)
		p := mustAcquire(t, b, 10)
		go func() { mustAcquire(t, b, 5).Release() }()
		synctest.Wait()
		time.Sleep(2 * time.Second)
		s := b.Stats()
		if s.OldestWait != 2*time.Second || s.Waiting != 1 || s.WaitingVertices != 5 {
			t.Fatalf("stats = %+v", s)
		}
		if s.InUse != s.Capacity {
			t.Fatalf("in use %d of %d, want full", s.InUse, s.Capacity)
		}
		p.Release()
		synctest.Wait()
	})
}
