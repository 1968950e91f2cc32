package middleware

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
)

// Issue 13, item 9: near math.MaxInt64 capacity "in use + charge" wrapped,
// a second charge was admitted into a full budget and every release then
// panicked. The capacity is capped with a validation error, and a budget at
// the cap compares without overflow.
func TestEdgeBudgetCapacityOverflow(t *testing.T) {
	for _, capacity := range []int64{math.MaxInt64, math.MaxInt64 / 2, 1<<40 + 1} {
		b, err := NewVertexBudget(capacity)
		if !errors.Is(err, spillway.ErrInvalidConfig) {
			t.Errorf("NewVertexBudget(%d): err = %v, want a validation error", capacity, err)
		}
		if b == nil {
			continue
		}
		// What the unchecked budget did: the second charge wraps past the
		// capacity check.
		p1, _ := b.Acquire(context.Background(), math.MaxInt64)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		p2, err := b.Acquire(ctx, math.MaxInt64)
		cancel()
		if err == nil {
			t.Errorf("capacity %d: a second full charge was admitted into a full budget", capacity)
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("capacity %d: release panicked: %v", capacity, r)
				}
			}()
			p2.Release()
			p1.Release()
		}()
	}

	// The largest accepted capacity works: a full charge, then nothing else
	// fits until it is released.
	const largest = 1 << 40
	b, err := NewVertexBudget(largest)
	if err != nil {
		t.Fatalf("NewVertexBudget(%d): %v", int64(largest), err)
	}
	if err := b.Resize(math.MaxInt64); err == nil {
		t.Error("Resize(math.MaxInt64) accepted")
	}
	full := mustAcquire(t, b, math.MaxInt64)
	if _, ok := b.tryAcquire(1); ok {
		t.Error("a full budget admitted one more vertex")
	}
	full.Release()
	p := mustAcquire(t, b, largest)
	p.Release()
	if s := b.Stats(); s.InUse != 0 || s.Capacity != largest {
		t.Errorf("stats after release = %+v", s)
	}
}
