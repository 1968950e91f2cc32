package main

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway/sizing"
)

// inputs is a deployment where the deadline binds: a memory bound of
// about 8.39M vertices, a deadline bound of 400k/s × 30 s × 0.5 = 6M.
func inputs() sizing.Inputs {
	return sizing.Inputs{
		MemoryBytes: 2 << 30, Processes: 2, BytesPerVertex: 128,
		VerticesPerSecond: 400_000, Deadline: 30 * time.Second,
		Headroom: defaultHeadroom, TailShare: defaultTailShare, Parallelism: 1,
	}
}

// A full budget of 6M vertices at 400k/s drains in 15 s, half the deadline.
func TestRecommendDrainTime(t *testing.T) {
	r, err := recommend(inputs(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.drainTime != 15*time.Second {
		t.Fatalf("drain time %v, want 15s", r.drainTime)
	}
}

// A measured spread narrows the drain share only when the slow messages
// need more room than the headroom leaves: at spread 2.5 the drain is held
// to 0.75 / 2.5 = 0.3 of the deadline; at spread 1.2 (0.75 / 1.2 = 0.625)
// the headroom of 0.5 is the tighter one and nothing changes. The advice
// names the bound that binds, and the slow messages when they set it.
func TestRecommendSpreadAndAdvice(t *testing.T) {
	tests := []struct {
		name           string
		spread, tail   float64
		share          float64
		limited        bool
		adviceMentions string
	}{
		{"not measured", 0, defaultTailShare, 0.5, false, "the deadline binds: a faster handler"},
		{"uniform", 1, defaultTailShare, 0.5, false, "the deadline binds: a faster handler"},
		{"below one counts as one", 0.4, defaultTailShare, 0.5, false, "the deadline binds: a faster handler"},
		{"narrow", 1.2, defaultTailShare, 0.5, false, "the deadline binds: a faster handler"},
		{"wide", 2.5, defaultTailShare, 0.3, true, "slowest messages (2.5×"},
		{"wide, own tail share", 2.5, 1, 0.4, true, "slowest messages"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := inputs()
			in.Spread, in.TailShare = tt.spread, tt.tail
			r, err := recommend(in, 0)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(r.drainShare-tt.share) > 1e-9 || r.spreadLimited != tt.limited {
				t.Errorf("drain share %v (limited %v), want %v (%v)", r.drainShare, r.spreadLimited, tt.share, tt.limited)
			}
			if want := time.Duration(float64(in.Deadline) * tt.share); (r.drainTime - want).Abs() > time.Millisecond {
				t.Errorf("drain time %v, want %v", r.drainTime, want)
			}
			if !strings.Contains(r.advice, tt.adviceMentions) {
				t.Errorf("advice %q does not mention %q", r.advice, tt.adviceMentions)
			}
		})
	}
	in := inputs()
	in.Processes = 4 // a memory bound of about 4.19M: memory binds
	if r, err := recommend(in, 0); err != nil || r.Binding != "memory" || !strings.HasPrefix(r.advice, "memory binds") {
		t.Errorf("memory bound: binding %q, advice %q, err %v", r.Binding, r.advice, err)
	}
}

// The warning names a largest message above the solo limit, and only then.
func TestRecommendWarnsAboveSoloLimit(t *testing.T) {
	in := inputs()
	in.Parallelism = 2 // one core: 200k/s × 30 s × 0.5 = 3M
	r, err := recommend(in, 3_000_001)
	if err != nil {
		t.Fatal(err)
	}
	if r.SoloLimit != 3_000_000 || !strings.Contains(r.warning, strconv.Itoa(3_000_001)) {
		t.Errorf("solo limit %d, warning %q; want 3000000 and a warning naming the largest message", r.SoloLimit, r.warning)
	}
	if r, _ := recommend(in, 3_000_000); r.warning != "" {
		t.Errorf("warning %q for a largest message at the solo limit", r.warning)
	}
}
