package middleware

import (
	"context"
	"testing"

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
		mw, err := NewBudget(BudgetConfig{Budget: mustVertexBudget(1 << 20)})
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
		mw, err := NewBudget(BudgetConfig{Budget: mustVertexBudget(4 * 1234)})
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
