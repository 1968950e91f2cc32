package middleware

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"golang.org/x/sync/semaphore"

	"github.com/spillway-go/spillway/cost"
)

// The baseline for VertexBudget is x/sync/semaphore.Weighted, measured in
// the same run: the same acquire/release pair, uncontended and with
// parallel goroutines (8 with GOMAXPROCS=2, via SetParallelism(4)).

func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	b.Run("impl=spillway/uncontended", func(b *testing.B) {
		vb := mustVertexBudget(1 << 20)
		b.ReportAllocs()
		for b.Loop() {
			p, _ := vb.Acquire(ctx, 100)
			vb.release(p)
		}
	})
	// The same pair on a budget split into two lanes (a light lane with a
	// reservation and the rest), charged in the light lane.
	b.Run("impl=spillway-lanes/uncontended", func(b *testing.B) {
		vb := mustVertexBudget(1<<20, WithLanes(Lane{Name: "light", MaxCharge: 1000, Reserve: 0.1}, Lane{Name: "heavy"}))
		b.ReportAllocs()
		for b.Loop() {
			p, _ := vb.Acquire(ctx, 100)
			vb.release(p)
		}
	})
	b.Run("impl=xsync/uncontended", func(b *testing.B) {
		s := semaphore.NewWeighted(1 << 20)
		b.ReportAllocs()
		for b.Loop() {
			_ = s.Acquire(ctx, 100)
			s.Release(100)
		}
	})
	// Contended: capacity for 4 of 8 goroutines at a time, so half of
	// them queue on every round.
	b.Run("impl=spillway/parallel8", func(b *testing.B) {
		vb := mustVertexBudget(400)
		b.ReportAllocs()
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p, _ := vb.Acquire(ctx, 100)
				vb.release(p)
			}
		})
	})
	b.Run("impl=spillway-lanes/parallel8", func(b *testing.B) {
		vb := mustVertexBudget(400, WithLanes(Lane{Name: "a", MaxCharge: 101}, Lane{Name: "b"}))
		b.ReportAllocs()
		b.SetParallelism(4)
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			// Half of the goroutines charge lane a, half lane b.
			v := int64(100 + n.Add(1)%2)
			for pb.Next() {
				p, _ := vb.Acquire(ctx, v)
				vb.release(p)
			}
		})
	})
	b.Run("impl=xsync/parallel8", func(b *testing.B) {
		s := semaphore.NewWeighted(400)
		b.ReportAllocs()
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = s.Acquire(ctx, 100)
				s.Release(100)
			}
		})
	})
}

// BenchmarkMiddleware compares a handler called bare with the same handler
// behind the Budget middleware (estimator reading vertex_count, admission,
// refund), called directly as the router would call it.
func BenchmarkMiddleware(b *testing.B) {
	handler := func(msg *message.Message) ([]*message.Message, error) { return nil, nil }
	newMsg := func() *message.Message {
		m := message.NewMessage("id", []byte("payload"))
		m.Metadata.Set(cost.MetadataKey, "1234")
		return m
	}
	b.Run("stack=bare", func(b *testing.B) {
		msg := newMsg()
		b.ReportAllocs()
		for b.Loop() {
			_, _ = handler(msg)
		}
	})
	b.Run("stack=budget", func(b *testing.B) {
		mw, err := New(mustVertexBudget(1 << 20))
		if err != nil {
			b.Fatal(err)
		}
		h := mw.Middleware(handler)
		msg := newMsg()
		b.ReportAllocs()
		for b.Loop() {
			_, _ = h(msg)
		}
	})
	b.Run("stack=bare/parallel8", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			msg := newMsg()
			for pb.Next() {
				_, _ = handler(msg)
			}
		})
	})
	b.Run("stack=budget/parallel8", func(b *testing.B) {
		mw, err := New(mustVertexBudget(4 * 1234))
		if err != nil {
			b.Fatal(err)
		}
		h := mw.Middleware(handler)
		b.ReportAllocs()
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			msg := newMsg()
			for pb.Next() {
				_, _ = h(msg)
			}
		})
	})
}

// mustVertexBudget is NewVertexBudget for capacities the test knows
// are valid.
func mustVertexBudget(capacity int64, opts ...Option) *VertexBudget {
	b, err := NewVertexBudget(capacity, opts...)
	if err != nil {
		panic(err)
	}
	return b
}

// BenchmarkAcquireReleaseInterleaved measures VertexBudget and
// semaphore.Weighted in alternating rounds of the same benchmark, so that
// both see the same load on a shared machine: each round times a block of
// acquire+release pairs on one, then the same block on the other, the
// order swapped from one round to the next. It
// reports both costs per pair (median over rounds) and their ratio
// (median of the per-round ratios); ns/op is the pair of blocks.
func BenchmarkAcquireReleaseInterleaved(b *testing.B) {
	ctx := context.Background()
	const block = 2000
	// par runs n pairs split over 8 goroutines, like RunParallel with
	// SetParallelism(4) on GOMAXPROCS=2.
	par := func(loop func(n int)) func(n int) {
		return func(n int) {
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() { loop(n / 8) })
			}
			wg.Wait()
		}
	}
	seq := func(loop func(n int)) func(n int) { return loop }
	pairs := func(capacity int64, lanes bool) (spill, xs func(n int)) {
		var opts []Option
		if lanes {
			opts = append(opts, WithLanes(Lane{Name: "light", MaxCharge: 1000, Reserve: 0.1}, Lane{Name: "heavy"}))
		}
		vb := mustVertexBudget(capacity, opts...)
		s := semaphore.NewWeighted(capacity)
		spill = func(n int) {
			for range n {
				p, _ := vb.Acquire(ctx, 100)
				vb.release(p)
			}
		}
		xs = func(n int) {
			for range n {
				_ = s.Acquire(ctx, 100)
				s.Release(100)
			}
		}
		return spill, xs
	}
	for _, c := range []struct {
		name     string
		capacity int64
		lanes    bool
		wrap     func(func(int)) func(int)
	}{
		{"uncontended", 1 << 20, false, seq},
		{"lanes/uncontended", 1 << 20, true, seq},
		{"parallel8", 400, false, par},
		{"lanes/parallel8", 400, true, par},
	} {
		b.Run(c.name, func(b *testing.B) {
			spill, xs := pairs(c.capacity, c.lanes)
			impls := [2]func(int){c.wrap(spill), c.wrap(xs)}
			var perOp [2][]float64
			var ratios []float64
			b.ReportAllocs()
			for round := 0; b.Loop(); round++ {
				var ns [2]float64
				// Alternate which goes first: the first block of a round
				// runs slower on this machine, whichever it is.
				for k := range 2 {
					i := (k + round) % 2
					start := time.Now()
					impls[i](block)
					ns[i] = float64(time.Since(start).Nanoseconds()) / block
					perOp[i] = append(perOp[i], ns[i])
				}
				ratios = append(ratios, ns[0]/ns[1])
			}
			b.ReportMetric(median(perOp[0]), "spillway-ns/pair")
			b.ReportMetric(median(perOp[1]), "xsync-ns/pair")
			b.ReportMetric(median(ratios), "ratio")
		})
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkMiddlewareInterleaved is BenchmarkMiddleware's uncontended pair
// in alternating rounds, as BenchmarkAcquireReleaseInterleaved does: each
// round times a block of messages through the bare handler and the same
// block through the Budget middleware, the order swapped every round. It
// reports both costs per message (median over rounds) and the overhead
// the middleware adds (median of the per-round differences).
func BenchmarkMiddlewareInterleaved(b *testing.B) {
	const block = 2000
	handler := func(msg *message.Message) ([]*message.Message, error) { return nil, nil }
	mw, err := New(mustVertexBudget(1 << 20))
	if err != nil {
		b.Fatal(err)
	}
	wrapped := mw.Middleware(handler)
	msg := message.NewMessage("id", []byte("payload"))
	msg.Metadata.Set(cost.MetadataKey, "1234")
	impls := [2]message.HandlerFunc{wrapped, handler}
	var perMsg [2][]float64
	var added []float64
	b.ReportAllocs()
	for round := 0; b.Loop(); round++ {
		var ns [2]float64
		for k := range 2 {
			i := (k + round) % 2
			h := impls[i]
			start := time.Now()
			for range block {
				_, _ = h(msg)
			}
			ns[i] = float64(time.Since(start).Nanoseconds()) / block
			perMsg[i] = append(perMsg[i], ns[i])
		}
		added = append(added, ns[0]-ns[1])
	}
	b.ReportMetric(median(perMsg[0]), "budget-ns/msg")
	b.ReportMetric(median(perMsg[1]), "bare-ns/msg")
	b.ReportMetric(median(added), "added-ns/msg")
}
