package sizing_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/sizing"
)

// baseInputs has round numbers: 1 GiB for one process at 128 B/vertex is a
// memory bound of 8,388,608 vertices; 400k vertices/s × 30 s × 0.5 is a
// deadline bound of 6,000,000.
func baseInputs() sizing.Inputs {
	return sizing.Inputs{
		MemoryBytes:       1 << 30,
		Processes:         1,
		BytesPerVertex:    128,
		VerticesPerSecond: 400_000,
		Deadline:          30 * time.Second,
	}
}

func TestRecommendSmallerBoundWins(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*sizing.Inputs)
		budget  int64
		binding string
	}{
		{"deadline binds", func(*sizing.Inputs) {}, 6_000_000, "deadline"},
		{"memory binds", func(in *sizing.Inputs) { in.VerticesPerSecond = 800_000 }, 8_388_608, "memory"},
		{"prefetch is taken off", func(in *sizing.Inputs) {
			in.VerticesPerSecond = 800_000
			in.PrefetchBytes = 256 << 20
		}, 6_291_456, "memory"},
		{"tie goes to memory", func(in *sizing.Inputs) {
			in.Deadline = 16 * time.Second // × 0.5 = 8 s
			in.VerticesPerSecond = 1 << 20
		}, 8_388_608, "memory"},
		{"headroom scales the deadline bound", func(in *sizing.Inputs) { in.Headroom = 0.25 }, 3_000_000, "deadline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := baseInputs()
			tt.edit(&in)
			r, err := sizing.Recommend(in)
			if err != nil {
				t.Fatal(err)
			}
			if r.Budget != tt.budget || r.Binding != tt.binding {
				t.Fatalf("budget %d (%s), want %d (%s); bounds: memory %d, deadline %d",
					r.Budget, r.Binding, tt.budget, tt.binding, r.MemoryBound, r.DeadlineBound)
			}
			if r.Budget != min(r.MemoryBound, r.DeadlineBound) {
				t.Fatalf("budget %d is not the smaller of %d and %d", r.Budget, r.MemoryBound, r.DeadlineBound)
			}
			want := map[string]int64{"memory": r.MemoryBound, "deadline": r.DeadlineBound}
			if want[r.Binding] != r.Budget {
				t.Fatalf("binding %q names a bound of %d, budget is %d", r.Binding, want[r.Binding], r.Budget)
			}
			explicit := in
			if explicit.Headroom == 0 {
				explicit.Headroom = 0.5
			}
			if explicit.Processes == 0 {
				explicit.Processes = 1
			}
			if e, err := sizing.Recommend(explicit); err != nil || e != r {
				t.Fatalf("defaults not filled in: %+v, with them explicit %+v (%v)", r, e, err)
			}
		})
	}
}

// A case built so that the deadline binds by a little: doubling the
// processes per container or halving the container's memory halves the
// memory bound, and memory binds instead.
func TestRecommendBindingFlips(t *testing.T) {
	in := baseInputs()
	in.VerticesPerSecond = 500_000 // deadline bound 7.5M, memory bound 8.39M
	r, err := sizing.Recommend(in)
	if err != nil {
		t.Fatal(err)
	}
	if r.Binding != "deadline" {
		t.Fatalf("baseline: %s binds (memory %d, deadline %d), want deadline", r.Binding, r.MemoryBound, r.DeadlineBound)
	}

	for name, edit := range map[string]func(*sizing.Inputs){
		"double the processes": func(in *sizing.Inputs) { in.Processes *= 2 },
		"halve the memory":     func(in *sizing.Inputs) { in.MemoryBytes /= 2 },
	} {
		t.Run(name, func(t *testing.T) {
			in := in
			edit(&in)
			f, err := sizing.Recommend(in)
			if err != nil {
				t.Fatal(err)
			}
			if f.Binding != "memory" {
				t.Fatalf("%s binds (memory %d, deadline %d), want memory", f.Binding, f.MemoryBound, f.DeadlineBound)
			}
			if f.MemoryBound != r.MemoryBound/2 || f.DeadlineBound != r.DeadlineBound {
				t.Fatalf("bounds %d/%d, want %d/%d", f.MemoryBound, f.DeadlineBound, r.MemoryBound/2, r.DeadlineBound)
			}
			if f.Budget >= r.Budget {
				t.Fatalf("budget %d did not shrink from %d", f.Budget, r.Budget)
			}
		})
	}
}

func TestRecommendRejectsBadInputs(t *testing.T) {
	tests := []struct {
		field string
		edit  func(*sizing.Inputs)
	}{
		{"memory_bytes", func(in *sizing.Inputs) { in.MemoryBytes = 0 }},
		{"memory_bytes", func(in *sizing.Inputs) { in.MemoryBytes = -1 }},
		{"processes", func(in *sizing.Inputs) { in.Processes = -2 }},
		{"prefetch_bytes", func(in *sizing.Inputs) { in.PrefetchBytes = -1 }},
		{"bytes_per_vertex", func(in *sizing.Inputs) { in.BytesPerVertex = 0 }},
		{"bytes_per_vertex", func(in *sizing.Inputs) { in.BytesPerVertex = math.NaN() }},
		{"vertices_per_second", func(in *sizing.Inputs) { in.VerticesPerSecond = -5 }},
		{"vertices_per_second", func(in *sizing.Inputs) { in.VerticesPerSecond = math.Inf(1) }},
		{"deadline", func(in *sizing.Inputs) { in.Deadline = 0 }},
		{"deadline", func(in *sizing.Inputs) { in.Deadline = -time.Second }},
		{"headroom", func(in *sizing.Inputs) { in.Headroom = 1.5 }},
		{"headroom", func(in *sizing.Inputs) { in.Headroom = -0.5 }},
		{"spread", func(in *sizing.Inputs) { in.Spread = -1 }},
		{"spread", func(in *sizing.Inputs) { in.Spread = math.NaN() }},
		{"spread", func(in *sizing.Inputs) { in.Spread = math.Inf(1) }},
		{"tail_share", func(in *sizing.Inputs) { in.TailShare = 1.5 }},
		{"tail_share", func(in *sizing.Inputs) { in.TailShare = -0.1 }},
	}
	for _, tt := range tests {
		in := baseInputs()
		tt.edit(&in)
		_, err := sizing.Recommend(in)
		if !errors.Is(err, spillway.ErrInvalidConfig) {
			t.Errorf("%s: error %v, want ErrInvalidInput", tt.field, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.field) {
			t.Errorf("error %q does not name the field %s", err, tt.field)
		}
	}
}

// A measured spread narrows the drain share only when the slow messages
// need more room than the headroom leaves: 400k vertices/s × 30 s is 12M
// vertices of drain; at spread 2.5 the slowest take 2.5 × the drain time,
// so the drain is held to 0.75 / 2.5 = 0.3 of the deadline (3.6M vertices).
// At spread 1.2 (0.75 / 1.2 = 0.625) the headroom of 0.5 is the tighter
// one and nothing changes.
func TestRecommendSpread(t *testing.T) {
	tests := []struct {
		name          string
		spread, tail  float64
		deadlineBound int64
	}{
		{"not measured", 0, 0, 6_000_000},
		{"uniform", 1, 0, 6_000_000},
		{"below one counts as one", 0.4, 0, 6_000_000},
		{"narrow", 1.2, 0, 6_000_000},
		{"wide", 2.5, 0, 3_600_000},
		{"wide, own tail share", 2.5, 1, 4_800_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := baseInputs()
			in.Spread, in.TailShare = tt.spread, tt.tail
			r, err := sizing.Recommend(in)
			if err != nil {
				t.Fatal(err)
			}
			if d := r.DeadlineBound - tt.deadlineBound; d < -1 || d > 1 {
				t.Errorf("deadline bound %d, want %d", r.DeadlineBound, tt.deadlineBound)
			}
			if r.Binding != "deadline" || r.Budget != r.DeadlineBound {
				t.Errorf("budget %d bound by %s, want the deadline bound", r.Budget, r.Binding)
			}
		})
	}
}

func TestRecommendInfeasible(t *testing.T) {
	tests := []struct {
		name string
		edit func(*sizing.Inputs)
		want string
	}{
		{"prefetch eats the memory", func(in *sizing.Inputs) {
			in.Processes = 4
			in.PrefetchBytes = 256 << 20
		}, "prefetch"},
		{"no vertex fits", func(in *sizing.Inputs) { in.MemoryBytes = 100 }, "no vertex"},
		{"nothing drains", func(in *sizing.Inputs) { in.VerticesPerSecond = 0.01 }, "drains"},
	}
	for _, tt := range tests {
		in := baseInputs()
		tt.edit(&in)
		r, err := sizing.Recommend(in)
		if !errors.Is(err, sizing.ErrInfeasible) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want ErrInfeasible mentioning %q", tt.name, err, tt.want)
		}
		if want := sizing.MemoryBound(in.MemoryBytes, in.Processes, in.PrefetchBytes, in.BytesPerVertex); r.MemoryBound != want || r.Budget > r.MemoryBound {
			t.Errorf("%s: the recommendation does not carry the bounds: %+v, want memory bound %d", tt.name, r, want)
		}
	}
}

// TestDeadlineBound pins the deadline bound's formula: rate × deadline ×
// share, 0 for no rate.
func TestDeadlineBound(t *testing.T) {
	if got := sizing.DeadlineBound(10_000, 60*time.Second, 0.5); got != 300_000 {
		t.Errorf("DeadlineBound(10k/s, 60s, default headroom) = %d, want 300000", got)
	}
	if got := sizing.DeadlineBound(math.NaN(), time.Second, 0.5); got != 0 {
		t.Errorf("DeadlineBound(NaN) = %d, want 0", got)
	}
	if got := sizing.DeadlineBound(0, time.Second, 0.5); got != 0 {
		t.Errorf("DeadlineBound(0) = %d, want 0", got)
	}
}
