package autoscale

import (
	"testing"
	"time"
)

func TestLagDesired(t *testing.T) {
	l := Limits{Min: 1, Max: 8}
	for _, tc := range []struct {
		lag, threshold int64
		want           int
	}{
		{0, 100, 1},     // nothing waits: the minimum
		{1, 100, 1},     // ceil
		{100, 100, 1},   // exactly one process's worth
		{101, 100, 2},   // a message more needs another
		{750, 100, 8},   // at the cap
		{10000, 100, 8}, // capped
		{5, 0, 1},       // no threshold: the minimum
	} {
		if got := LagDesired(tc.lag, tc.threshold, l); got != tc.want {
			t.Errorf("LagDesired(%d, %d) = %d, want %d", tc.lag, tc.threshold, got, tc.want)
		}
	}
}

func TestDrainDesired(t *testing.T) {
	l := Limits{Min: 1, Max: 8}
	target := 10 * time.Second
	for name, tc := range map[string]struct {
		s       DrainSignal
		current int
		want    int
	}{
		"no backlog scales in to the minimum": {DrainSignal{Backlog: 0, Rate: 0}, 5, 1},
		"no rate yet keeps the size":          {DrainSignal{Backlog: 5000}, 3, 3},
		"zero rates keep the size":            {DrainSignal{Backlog: 5000, Rates: 2}, 4, 4},
		"no rate keeps the size within caps":  {DrainSignal{Backlog: 5000}, 12, 8},
		"within the target: one":              {DrainSignal{Backlog: 9000, Rate: 1000, Rates: 1}, 3, 1},
		"ceil of seconds over target":         {DrainSignal{Backlog: 25000, Rate: 1000, Rates: 2}, 1, 3},
		"capped at the maximum":               {DrainSignal{Backlog: 1e6, Rate: 1000, Rates: 1}, 1, 8},
	} {
		if got := DrainDesired(tc.s, target, tc.current, l); got != tc.want {
			t.Errorf("%s: DrainDesired(%+v, current %d) = %d, want %d", name, tc.s, tc.current, got, tc.want)
		}
	}
}

// TestStabilizer: scaling out follows the answer at once; scaling in waits
// until the window holds no higher answer, and then goes to the highest
// answer still in it.
func TestStabilizer(t *testing.T) {
	s := &Stabilizer{Window: 10 * time.Second}
	t0 := time.Unix(1000, 0)
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	steps := []struct {
		sec, desired, current, want int
	}{
		{0, 1, 1, 1},
		{2, 6, 1, 6},  // out at once
		{4, 2, 6, 6},  // 6 is in the window
		{8, 1, 6, 6},  // still
		{13, 1, 6, 2}, // 6 (at 2 s) left the window; 2 (at 4 s) is the highest left
		{15, 1, 2, 1}, // 2 left too
		{16, 3, 1, 3}, // out again at once
	}
	for _, st := range steps {
		if got := s.Next(at(st.sec), st.desired, st.current); got != st.want {
			t.Fatalf("at %ds: Next(desired %d, current %d) = %d, want %d", st.sec, st.desired, st.current, got, st.want)
		}
	}
}

func TestThresholds(t *testing.T) {
	o := DefaultOptions()
	o.Target = 10 * time.Second
	o.Work = WorkModel{PerMessage: 0, PerVertex: time.Millisecond, Slots: 1} // 1,000 vertices/s
	// 1,000 pings and 10 boundaries of 1,000: 11,000 vertices in 1,010
	// messages, about 10.9 vertices a message: 1000/10.9 messages/s.
	m := mix{messages: 1010, vertices: 11000, boundaryMessages: 10, boundaryVertices: 10000}
	avg, low := thresholds(o, m)
	if avg != 919 { // ceil(10 s × 1000/(11000/1010))
		t.Errorf("average threshold %d, want 919", avg)
	}
	if low != 10 { // 10 s × one 1,000-vertex boundary a second
		t.Errorf("low threshold %d, want 10", low)
	}
}

// TestStreamIsSeeded: the same spec builds the same stream; bursts
// alternate, pings first, boundaries of real countries of at least
// MinBoundary vertices.
func TestStreamIsSeeded(t *testing.T) {
	spec := DefaultOptions().Stream
	a, err := spec.Build()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := spec.Build()
	if len(a) != len(b) || len(a) != 8 {
		t.Fatalf("%d and %d bursts, want 8", len(a), len(b))
	}
	for i := range a {
		if a[i].At != b[i].At || a[i].Kind != b[i].Kind || len(a[i].Items) != len(b[i].Items) || a[i].Vertices() != b[i].Vertices() {
			t.Fatalf("burst %d differs between two builds", i)
		}
		want := BurstPings
		if i%2 == 1 {
			want = BurstBoundaries
		}
		if a[i].Kind != want {
			t.Errorf("burst %d is %s, want %s", i, a[i].Kind, want)
		}
		for _, it := range a[i].Items {
			if (want == BurstPings && it.Vertices != 1) || (want == BurstBoundaries && it.Vertices < spec.MinBoundary) {
				t.Fatalf("burst %d (%s): message %s of %d vertices", i, want, it.ID, it.Vertices)
			}
		}
	}
	spec.Seed++
	c, _ := spec.Build()
	if c[1].Vertices() == a[1].Vertices() && c[3].Vertices() == a[3].Vertices() {
		t.Error("another seed builds the same boundary bursts")
	}
}
