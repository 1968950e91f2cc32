package shedding

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-go/spillway"
)

func popAll[T any](t *testing.T, q *Queue[T]) []T {
	t.Helper()
	var out []T
	for {
		v, ok := q.TryPop()
		if !ok {
			return out
		}
		out = append(out, v)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestQueueOverflowPolicies(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		overflow Overflow
		want     []int // contents after pushing 1..5 into a queue of 3
		dropped  []int // items given to OnDrop
		errs     int   // pushes that returned ErrFull
	}{
		{DropNewest, []int{1, 2, 3}, []int{4, 5}, 0},
		{DropOldest, []int{3, 4, 5}, []int{1, 2}, 0},
		{Reject, []int{1, 2, 3}, nil, 2},
	}
	for _, c := range cases {
		t.Run(c.overflow.String(), func(t *testing.T) {
			var dropped []int
			q := mustQueue(3, c.overflow, OnDrop(func(v int) { dropped = append(dropped, v) }))
			errs := 0
			for i := 1; i <= 5; i++ {
				switch err := q.Push(ctx, i); {
				case errors.Is(err, ErrFull):
					errs++
				case err != nil:
					t.Fatal(err)
				}
				if q.Len() > q.Cap() {
					t.Fatalf("len %d above capacity %d", q.Len(), q.Cap())
				}
			}
			if q.FillRatio() != 1 {
				t.Errorf("FillRatio = %v, want 1", q.FillRatio())
			}
			if errs != c.errs || uint64(errs) != q.Rejected() {
				t.Errorf("ErrFull %d times, Rejected %d, want %d", errs, q.Rejected(), c.errs)
			}
			if !equalInts(dropped, c.dropped) || q.Dropped() != uint64(len(c.dropped)) {
				t.Errorf("dropped %v (count %d), want %v", dropped, q.Dropped(), c.dropped)
			}
			if got := popAll(t, q); !equalInts(got, c.want) {
				t.Errorf("contents %v, want %v", got, c.want)
			}
			if q.Len() != 0 || q.FillRatio() != 0 {
				t.Errorf("drained queue: len %d, fill %v", q.Len(), q.FillRatio())
			}
		})
	}
}

func TestQueueFillRatioAndWrap(t *testing.T) {
	ctx := context.Background()
	q := mustQueue[int](4, Reject)
	if q.Cap() != 4 || q.Overflow() != Reject {
		t.Fatalf("Cap %d, Overflow %v", q.Cap(), q.Overflow())
	}
	// Walk the ring several times round.
	next, expect := 0, 0
	for round := 0; round < 10; round++ {
		for q.Len() < 3 {
			if err := q.Push(ctx, next); err != nil {
				t.Fatal(err)
			}
			next++
		}
		if q.FillRatio() != 0.75 {
			t.Fatalf("FillRatio = %v, want 0.75", q.FillRatio())
		}
		for q.Len() > 1 {
			v, err := q.Pop(ctx)
			if err != nil || v != expect {
				t.Fatalf("Pop = %d, %v; want %d", v, err, expect)
			}
			expect++
		}
		if q.FillRatio() != 0.25 {
			t.Fatalf("FillRatio = %v, want 0.25", q.FillRatio())
		}
	}
}

func TestQueueBlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		q := mustQueue[int](2, Block)
		_ = q.Push(ctx, 1)
		_ = q.Push(ctx, 2)

		// A blocked push completes when room is made, in FIFO order.
		var wg sync.WaitGroup
		for _, v := range []int{3, 4} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := q.Push(ctx, v); err != nil {
					t.Error(err)
				}
			}()
			synctest.Wait() // 3 blocks before 4 does
		}
		if q.Len() != 2 {
			t.Fatalf("len %d", q.Len())
		}
		for want := 1; want <= 4; want++ {
			v, err := q.Pop(ctx)
			if err != nil || v != want {
				t.Fatalf("Pop = %d, %v; want %d", v, err, want)
			}
			synctest.Wait()
		}
		wg.Wait()
		if q.Dropped() != 0 || q.Rejected() != 0 {
			t.Fatalf("Block dropped %d, rejected %d", q.Dropped(), q.Rejected())
		}
	})
}

func TestQueueBlockCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue[string](1, Block)
		_ = q.Push(context.Background(), "a")

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		err := q.Push(ctx, "b")
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 5*time.Second {
			t.Fatalf("Push = %v after %v, want deadline exceeded after 5s", err, time.Since(start))
		}
		if q.Len() != 1 {
			t.Fatalf("cancelled push changed the queue: len %d", q.Len())
		}
		// An already cancelled context fails at once on a full queue...
		if err := q.Push(ctx, "c"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Push = %v", err)
		}
		// ...but a push with room succeeds whatever the context.
		v, _ := q.Pop(context.Background())
		if v != "a" {
			t.Fatalf("Pop = %q", v)
		}
		if err := q.Push(ctx, "d"); err != nil {
			t.Fatalf("Push with room = %v", err)
		}

		// A blocked Pop is cancelled too.
		_, _ = q.Pop(context.Background())
		pctx, pcancel := context.WithCancel(context.Background())
		go func() {
			time.Sleep(time.Second)
			pcancel()
		}()
		if _, err := q.Pop(pctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Pop = %v, want canceled", err)
		}
	})
}

// A waiter that is woken and cancelled at the same moment either takes the
// item or hands the wake-up to the next waiter: no item is stranded while
// someone waits for it.
func TestQueueCancelHandsOnWakeup(t *testing.T) {
	for range 20 { // the woken waiter's select picks either way
		synctest.Test(t, func(t *testing.T) {
			q := mustQueue[int](1, Block)
			ctx, cancel := context.WithCancel(context.Background())
			got := make(chan int, 2)
			var wg sync.WaitGroup
			for _, c := range []context.Context{ctx, context.Background()} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if v, err := q.Pop(c); err == nil {
						got <- v
					}
				}()
				synctest.Wait() // the cancellable popper is first in line
			}
			// Wake the first popper and cancel it before it runs.
			q.mu.Lock()
			q.putLocked(7)
			q.poppers.wakeOne()
			cancel()
			q.mu.Unlock()
			synctest.Wait()
			if len(got) != 1 || q.Len() != 0 {
				t.Fatalf("%d pops succeeded, %d items left; want the item popped once", len(got), q.Len())
			}
			if v := <-got; v != 7 {
				t.Fatalf("got %d", v)
			}
			q.Close() // release whoever still waits
			wg.Wait()
		})
	}
}

func TestQueueClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		q := mustQueue[int](1, Block)
		_ = q.Push(ctx, 1)
		pushErr := make(chan error)
		go func() { pushErr <- q.Push(ctx, 2) }()
		synctest.Wait()
		q.Close()
		q.Close()
		if err := <-pushErr; !errors.Is(err, ErrClosed) {
			t.Fatalf("blocked Push = %v, want ErrClosed", err)
		}
		if err := q.Push(ctx, 3); !errors.Is(err, ErrClosed) {
			t.Fatalf("Push after Close = %v", err)
		}
		if v, err := q.Pop(ctx); v != 1 || err != nil {
			t.Fatalf("Pop = %d, %v; queued items drain after Close", v, err)
		}
		if _, err := q.Pop(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Pop on closed, empty queue = %v", err)
		}
		// A blocked Pop is released by Close.
		q2 := mustQueue[int](1, DropOldest)
		popErr := make(chan error)
		go func() { _, err := q2.Pop(ctx); popErr <- err }()
		synctest.Wait()
		q2.Close()
		if err := <-popErr; !errors.Is(err, ErrClosed) {
			t.Fatalf("blocked Pop = %v", err)
		}
	})
}

func TestQueueConstructorRejects(t *testing.T) {
	for name, c := range map[string]struct {
		capacity int
		overflow Overflow
		field    string
	}{
		"zero capacity":     {0, Block, "capacity"},
		"negative capacity": {-1, Reject, "capacity"},
		"unknown overflow":  {1, Overflow(9), "overflow"},
	} {
		q, err := NewQueue[int](c.capacity, c.overflow)
		var fe *spillway.FieldError
		if q != nil || !errors.Is(err, spillway.ErrInvalidConfig) || !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: NewQueue = %v, %v; want nil and a FieldError on %s", name, q, err, c.field)
		}
	}
	if Overflow(9).String() != "Overflow(9)" {
		t.Error(Overflow(9).String())
	}
}

// Many producers and consumers: every item is popped, dropped or rejected
// exactly once, and the length never exceeds the capacity.
func TestQueueRace(t *testing.T) {
	const producers, consumers, perProducer = 4, 3, 2000
	for _, overflow := range []Overflow{Block, DropNewest, DropOldest, Reject} {
		t.Run(overflow.String(), func(t *testing.T) {
			var droppedItems atomic.Int64
			q := mustQueue(8, overflow, OnDrop(func(int) { droppedItems.Add(1) }))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var pushed, rejected, popped atomic.Int64
			seen := make([]atomic.Int32, producers*perProducer)
			var pwg, cwg sync.WaitGroup
			for c := 0; c < consumers; c++ {
				cwg.Add(1)
				go func() {
					defer cwg.Done()
					for {
						v, err := q.Pop(ctx)
						if err != nil {
							return
						}
						seen[v].Add(1)
						popped.Add(1)
						if l := q.Len(); l > q.Cap() || l < 0 {
							t.Errorf("len %d", l)
						}
					}
				}()
			}
			for p := 0; p < producers; p++ {
				pwg.Add(1)
				go func() {
					defer pwg.Done()
					for i := 0; i < perProducer; i++ {
						switch err := q.Push(ctx, p*perProducer+i); {
						case err == nil:
							pushed.Add(1)
						case errors.Is(err, ErrFull):
							rejected.Add(1)
						default:
							t.Error(err)
						}
					}
				}()
			}
			pwg.Wait()
			q.Close()
			cwg.Wait()
			total := int64(producers * perProducer)
			if pushed.Load()+rejected.Load() != total {
				t.Fatalf("pushed %d + rejected %d != %d", pushed.Load(), rejected.Load(), total)
			}
			if popped.Load()+droppedItems.Load() != pushed.Load() {
				t.Fatalf("popped %d + dropped %d != pushed %d", popped.Load(), droppedItems.Load(), pushed.Load())
			}
			if uint64(droppedItems.Load()) != q.Dropped() || uint64(rejected.Load()) != q.Rejected() {
				t.Fatalf("counters: dropped %d/%d rejected %d/%d", droppedItems.Load(), q.Dropped(), rejected.Load(), q.Rejected())
			}
			for i := range seen {
				if seen[i].Load() > 1 {
					t.Fatalf("item %d popped %d times", i, seen[i].Load())
				}
			}
			if overflow == Block && popped.Load() != total {
				t.Fatalf("Block lost items: popped %d of %d", popped.Load(), total)
			}
		})
	}
}

// mustQueue is NewQueue for arguments the test knows are valid.
func mustQueue[T any](capacity int, overflow Overflow, opts ...QueueOption[T]) *Queue[T] {
	q, err := NewQueue(capacity, overflow, opts...)
	if err != nil {
		panic(err)
	}
	return q
}
