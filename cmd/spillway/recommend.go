package main

import (
	"fmt"
	"math"
	"time"

	"github.com/spillway-go/spillway/sizing"
)

// Defaults of sizing.Inputs that "spillway size" shows as flag defaults.
const (
	defaultHeadroom  = 0.5  // share of the deadline a full budget may take to drain
	defaultTailShare = 0.75 // share of the deadline the slowest messages may take
)

// recommendation is sizing.Recommend's bounds with what "spillway size"
// reports beside them: how long a full budget drains and what share of the
// deadline that may be, what raises the budget, and a warning when the
// sample's largest message is above the solo limit.
type recommendation struct {
	sizing.Bounds
	// drainShare is the share of the deadline a full budget may take to
	// drain: the headroom, or the tail share over the spread if that is
	// smaller (spreadLimited).
	drainShare    float64
	spreadLimited bool
	// drainTime is how long a full budget takes at the measured
	// throughput.
	drainTime time.Duration
	advice    string
	warning   string // "" unless largest is above the solo limit
}

// recommend computes the bounds for in, whose Headroom, TailShare,
// Processes and Parallelism are set (the flags give every default), and
// what the report says about them. largest is the vertices of the
// sample's largest message. The error is Recommend's; the bounds are
// filled in for display even then.
func recommend(in sizing.Inputs, largest int64) (recommendation, error) {
	b, err := sizing.Recommend(in)
	r := recommendation{Bounds: b, drainShare: in.Headroom}
	if in.Spread > 0 {
		if t := in.TailShare / max(in.Spread, 1); t < in.Headroom {
			r.drainShare, r.spreadLimited = t, true
		}
	}
	r.drainTime = drainTime(b.Budget, in.VerticesPerSecond)
	switch {
	case b.Binding == "deadline" && r.spreadLimited:
		r.advice = fmt.Sprintf("the deadline binds, through the mix's slowest messages (%.1f× the mean cost per vertex): a faster handler on them, more cores per process or a longer redelivery deadline raise the budget; more memory does not", in.Spread)
	case b.Binding == "deadline":
		r.advice = "the deadline binds: a faster handler, more cores per process or a longer redelivery deadline raise the budget; more memory does not"
	default:
		r.advice = "memory binds: a bigger container, fewer processes per container or a smaller broker prefetch raise the budget; a faster handler does not"
	}
	if largest > b.SoloLimit {
		core := in.VerticesPerSecond / float64(max(in.Parallelism, 1))
		r.warning = fmt.Sprintf("the sample's largest message (%d vertices) is above the solo limit (%d): alone on one core it takes %v, more than %v × %.2f; "+
			"route messages above the limit elsewhere (budget.max_message_vertices), or make the handler faster on them",
			largest, b.SoloLimit, drainTime(largest, core).Round(time.Millisecond), in.Deadline, in.Headroom)
	}
	return r, err
}

// drainTime is how long vertices take at vps, saturating.
func drainTime(vertices int64, vps float64) time.Duration {
	if vps <= 0 {
		return 0
	}
	s := float64(vertices) / vps
	if s*float64(time.Second) >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}
