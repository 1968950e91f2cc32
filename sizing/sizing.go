package sizing

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/spillway-go/spillway"
)

// The names of the limits on a vertex budget, as [Recommendation.Binding]
// and [AutoBounds.Binding] report them. They are the values of the bound
// label of the spillway.budget.bound and spillway.budget.binding metrics.
const (
	// boundMemory: the budget is limited by the memory the in-flight
	// geometry may take. A bigger container, fewer processes per container
	// or a smaller broker prefetch raise it; a faster handler does not.
	boundMemory = "memory"
	// boundDeadline: the budget is limited by how much work drains within
	// the broker's redelivery deadline. A faster handler (or more cores) or
	// a longer deadline raise it; more memory does not.
	boundDeadline = "deadline"
	// boundTail: an auto-sized budget is limited by its tail guard, the
	// slowest handler call of the recent windows (see
	// [AutoSizeConfig.TailShare]). Like the deadline bound, it is about the
	// deadline: a faster handler on the slow messages raises it.
	boundTail = "tail"
)

// DefaultHeadroom is the share of the redelivery deadline that a full budget
// may take to drain. The rest is kept for what the measurement does not see:
// noticing the rebalance or claim, acking and committing, GC pauses, a
// noisy neighbour on the same cores, and a mix heavier than the sample.
const DefaultHeadroom = 0.5

// DefaultTailShare is the share of the redelivery deadline the slowest
// messages may take while a full budget drains (see [Inputs.Spread]
// and [AutoSizeConfig.TailShare]).
const DefaultTailShare = 0.75

// ErrInfeasible is returned by [Recommend] when the inputs are valid but a
// bound is below one vertex (the per-process memory cannot hold a single
// vertex, or nothing drains within the deadline). The wrapping error says
// which.
var ErrInfeasible = errors.New("sizing: no budget fits")

// Inputs are what a vertex budget is computed from: two measurements
// ([MeasureBytesPerVertex], [MeasureThroughput]) and three facts about the
// deployment.
type Inputs struct {
	// MemoryBytes is the memory the consumers of one container (or host)
	// may use for in-flight geometry, in bytes: the container limit minus
	// what the processes need besides it (their idle RSS). Required.
	MemoryBytes int64 `json:"memory_bytes"`
	// Processes is how many consumer processes share MemoryBytes; each
	// gets an equal part. 0 means 1.
	Processes int `json:"processes"`
	// PrefetchBytes is what each process's broker client buffers ahead of
	// the handlers (Kafka fetch buffers, a Redis read batch): memory that
	// is taken before any message is admitted. 0 means none.
	PrefetchBytes int64 `json:"prefetch_bytes"`
	// BytesPerVertex is the measured memory per in-flight vertex
	// ([MemoryProfile.BytesPerVertex]). Required.
	BytesPerVertex float64 `json:"bytes_per_vertex"`
	// VerticesPerSecond is the measured throughput of one process, at the
	// parallelism production runs ([Throughput.VerticesPerSecond]).
	// Required.
	VerticesPerSecond float64 `json:"vertices_per_second"`
	// Deadline is the broker's redelivery deadline: Kafka's
	// Consumer.Group.Rebalance.Timeout, Redis Streams' idle-claim time.
	// Required.
	Deadline time.Duration `json:"deadline_ns"`
	// Headroom is the share of Deadline a full budget may take to drain,
	// in (0, 1]. 0 means [DefaultHeadroom].
	Headroom float64 `json:"headroom"`
	// Spread is how much more the slow vertices of the mix cost than the
	// average one ([Throughput.Spread]); 0 means not measured, and values
	// below 1 count as 1. While a full budget drains, the messages in
	// flight share the cores, so a message whose vertices cost Spread
	// times the mean takes about Spread times the drain time. The drain
	// time is therefore held to TailShare / Spread of the deadline when
	// that is below Headroom: the slow messages, not the average, must
	// finish inside the deadline.
	Spread float64 `json:"spread"`
	// TailShare is the share of Deadline the slow messages may take, in
	// (0, 1]. 0 means [DefaultTailShare]. Used only with Spread.
	TailShare float64 `json:"tail_share"`
	// Parallelism is how many handlers ran at once when VerticesPerSecond
	// was measured ([WithParallelism]; GOMAXPROCS by default). One message
	// runs on one core, so VerticesPerSecond / Parallelism is how fast a
	// message goes alone: it sets [Recommendation.SoloLimit]. 0 means 1
	// (VerticesPerSecond is a single core's).
	Parallelism int `json:"parallelism"`
	// LargestMessage is the vertices of the sample's largest message
	// (the largest of [Sample.Vertices]); 0 means not known. Recommend
	// warns when it is above the solo limit.
	LargestMessage int64 `json:"largest_message"`
}

// Recommendation is a computed vertex budget with the bounds it came from,
// so a reader can tell which team moves it: see [Recommendation.Advice].
type Recommendation struct {
	// Budget is the smaller of the two bounds: the capacity to give
	// middleware.NewVertexBudget.
	Budget int64 `json:"budget"`
	// Binding names the bound that set Budget: "memory" or "deadline". On
	// a tie it is "memory".
	Binding string `json:"binding"`
	// MemoryBound is (MemoryBytes / Processes − PrefetchBytes) /
	// BytesPerVertex, in vertices.
	MemoryBound int64 `json:"memory_bound"`
	// DeadlineBound is VerticesPerSecond × Deadline × DrainShare, in
	// vertices.
	DeadlineBound int64 `json:"deadline_bound"`
	// DrainShare is the share of Deadline a full budget may take to
	// drain: Headroom, or TailShare / Spread if that is smaller.
	DrainShare float64 `json:"drain_share"`
	// SpreadLimited says that TailShare / Spread, not Headroom, set
	// DrainShare: the mix's slow messages bind the deadline bound.
	SpreadLimited bool `json:"spread_limited"`
	// DrainTime is how long a full budget takes to drain at the measured
	// throughput: at most Deadline × DrainShare.
	DrainTime time.Duration `json:"drain_ns"`

	// SoloLimit is the largest message that finishes alone within
	// Deadline × Headroom: VerticesPerSecond / Parallelism (one core) ×
	// Deadline × Headroom. No budget makes a bigger message safe: alone on
	// one core it holds its delivery past that share of the deadline. Send
	// bigger ones elsewhere (the router's budget.max_message_vertices).
	SoloLimit int64 `json:"solo_limit"`
	// Warning is empty unless the sample's largest message
	// (Inputs.LargestMessage) is above SoloLimit; then it says so, and
	// what to do.
	Warning string `json:"warning,omitempty"`

	// spread is Inputs.Spread, for Advice.
	spread float64
}

// Advice says, in one sentence, what raises the budget.
func (r Recommendation) Advice() string {
	if r.Binding == boundDeadline && r.SpreadLimited {
		return fmt.Sprintf("the deadline binds, through the mix's slowest messages (%.1f× the mean cost per vertex): a faster handler on them, more cores per process or a longer redelivery deadline raise the budget; more memory does not", r.spread)
	}
	if r.Binding == boundDeadline {
		return "the deadline binds: a faster handler, more cores per process or a longer redelivery deadline raise the budget; more memory does not"
	}
	return "memory binds: a bigger container, fewer processes per container or a smaller broker prefetch raise the budget; a faster handler does not"
}

// withDefaults fills in the defaults and validates in.
func (in Inputs) withDefaults() (Inputs, error) {
	if in.Processes == 0 {
		in.Processes = 1
	}
	if in.Headroom == 0 {
		in.Headroom = DefaultHeadroom
	}
	if in.TailShare == 0 {
		in.TailShare = DefaultTailShare
	}
	bad := func(field string, v any, want string) error {
		return &spillway.FieldError{Field: field, Value: fmt.Sprint(v), Reason: want}
	}
	switch {
	case in.MemoryBytes <= 0:
		return in, bad("memory_bytes", in.MemoryBytes, "must be positive")
	case in.Processes < 0:
		return in, bad("processes", in.Processes, "must be positive")
	case in.PrefetchBytes < 0:
		return in, bad("prefetch_bytes", in.PrefetchBytes, "must not be negative")
	case !positiveFinite(in.BytesPerVertex):
		return in, bad("bytes_per_vertex", in.BytesPerVertex, "must be a positive number")
	case !positiveFinite(in.VerticesPerSecond):
		return in, bad("vertices_per_second", in.VerticesPerSecond, "must be a positive number")
	case in.Deadline <= 0:
		return in, bad("deadline", in.Deadline, "must be positive")
	case !positiveFinite(in.Headroom) || in.Headroom > 1:
		return in, bad("headroom", in.Headroom, "must be in (0, 1]")
	case in.Spread < 0 || math.IsInf(in.Spread, 0) || math.IsNaN(in.Spread):
		return in, bad("spread", in.Spread, "must be a non-negative number")
	case !positiveFinite(in.TailShare) || in.TailShare > 1:
		return in, bad("tail_share", in.TailShare, "must be in (0, 1]")
	case in.Parallelism < 0:
		return in, bad("parallelism", in.Parallelism, "must not be negative")
	case in.LargestMessage < 0:
		return in, bad("largest_message", in.LargestMessage, "must not be negative")
	}
	return in, nil
}

func positiveFinite(f float64) bool { return f > 0 && !math.IsInf(f, 0) && !math.IsNaN(f) }

// MemoryBound returns how many vertices fit in the memory one process has
// for in-flight geometry: (memoryBytes / processes − prefetchBytes) /
// bytesPerVertex, rounded down. It does no validation; see [Recommend].
func MemoryBound(memoryBytes int64, processes int, prefetchBytes int64, bytesPerVertex float64) int64 {
	perProcess := memoryBytes/int64(max(processes, 1)) - prefetchBytes
	return floorInt64(float64(perProcess) / bytesPerVertex)
}

// drainShare returns the share of the deadline a full budget may take to
// drain: headroom, or tailShare / spread when the mix's slow messages need
// more room than that (spread above tailShare / headroom). A spread of 0
// (not measured) leaves headroom; a spread below 1 counts as 1. The second
// result says whether the spread set the share.
func drainShare(headroom, spread, tailShare float64) (float64, bool) {
	if spread <= 0 || tailShare <= 0 {
		return headroom, false
	}
	if t := tailShare / max(spread, 1); t < headroom {
		return t, true
	}
	return headroom, false
}

// DeadlineBound returns how many vertices drain within headroom × deadline
// at verticesPerSecond, rounded down. It does no validation; see
// [Recommend].
func DeadlineBound(verticesPerSecond float64, deadline time.Duration, headroom float64) int64 {
	return floorInt64(verticesPerSecond * deadline.Seconds() * headroom)
}

// floorInt64 rounds f down to an int64, saturating at the ends of the range
// (NaN gives 0).
func floorInt64(f float64) int64 {
	switch {
	case f != f || f <= 0:
		return 0
	case f >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(f)
}

// Recommend computes a vertex budget from in: the memory bound, the deadline
// bound, and the smaller of them, named in Binding.
//
//	memory bound   = (MemoryBytes / Processes − PrefetchBytes) / BytesPerVertex
//	drain share    = min(Headroom, TailShare / Spread)   (Headroom if Spread is 0)
//	deadline bound = VerticesPerSecond × Deadline × drain share
//	budget         = min(memory bound, deadline bound)
//	solo limit     = VerticesPerSecond / Parallelism × Deadline × Headroom
//
// The solo limit is the largest message that finishes alone on one core
// within the deadline's headroom; Warning says when the sample's largest
// message (Inputs.LargestMessage) is bigger.
//
// Invalid inputs fail with a [*spillway.FieldError] (matching
// [spillway.ErrInvalidConfig]) that names the field. If the prefetch leaves no memory for geometry or a bound is
// below one vertex, the error wraps [ErrInfeasible] and the returned
// Recommendation still carries the bounds, for display. Recommend is a pure
// function.
func Recommend(in Inputs) (Recommendation, error) {
	in, err := in.withDefaults()
	if err != nil {
		return Recommendation{}, err
	}
	share, limited := drainShare(in.Headroom, in.Spread, in.TailShare)
	geometry := in.MemoryBytes/int64(in.Processes) - in.PrefetchBytes
	r := Recommendation{
		MemoryBound:   MemoryBound(in.MemoryBytes, in.Processes, in.PrefetchBytes, in.BytesPerVertex),
		DeadlineBound: DeadlineBound(in.VerticesPerSecond, in.Deadline, share),
		DrainShare:    share,
		SpreadLimited: limited,
		spread:        in.Spread,
	}
	r.Budget, r.Binding = r.MemoryBound, boundMemory
	if r.DeadlineBound < r.MemoryBound {
		r.Budget, r.Binding = r.DeadlineBound, boundDeadline
	}
	r.DrainTime = drainTime(r.Budget, in.VerticesPerSecond)
	// One message runs on one core: the deadline bound of a single core.
	core := in.VerticesPerSecond / float64(max(in.Parallelism, 1))
	r.SoloLimit = DeadlineBound(core, in.Deadline, in.Headroom)
	if in.LargestMessage > r.SoloLimit {
		r.Warning = fmt.Sprintf("the sample's largest message (%d vertices) is above the solo limit (%d): alone on one core it takes %v, more than %v × %.2f; "+
			"route messages above the limit elsewhere (budget.max_message_vertices), or make the handler faster on them",
			in.LargestMessage, r.SoloLimit, drainTime(in.LargestMessage, core).Round(time.Millisecond),
			in.Deadline, in.Headroom)
	}
	switch {
	case geometry <= 0:
		return r, fmt.Errorf("%w: prefetch_bytes (%d) leaves no memory for geometry out of %d bytes per process",
			ErrInfeasible, in.PrefetchBytes, in.MemoryBytes/int64(in.Processes))
	case r.MemoryBound < 1:
		return r, fmt.Errorf("%w: %d bytes per process hold no vertex at %.0f bytes per vertex",
			ErrInfeasible, geometry, in.BytesPerVertex)
	case r.DeadlineBound < 1:
		return r, fmt.Errorf("%w: not one vertex drains within %v × %.2f at %.3g vertices/s",
			ErrInfeasible, in.Deadline, share, in.VerticesPerSecond)
	}
	return r, nil
}

// drainTime is how long budget vertices take at vps, saturating.
func drainTime(budget int64, vps float64) time.Duration {
	if vps <= 0 {
		return 0
	}
	s := float64(budget) / vps
	if s*float64(time.Second) >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}
