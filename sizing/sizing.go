package sizing

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/spillway-go/spillway"
)

// The names of the limits on a vertex budget, as [Bounds.Binding] reports
// them. They are the values of the bound label of the spillway.budget.bound
// and spillway.budget.binding metrics.
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
	// slowest handler call of the recent windows (see [Config.TailShare]).
	// Like the deadline bound, it is about the deadline: a faster handler
	// on the slow messages raises it.
	boundTail = "tail"
	// boundThroughput: an auto-sized budget is held where growing it
	// last did not raise the throughput (see [AutoSizer]): past that, a
	// larger budget only makes messages wait longer inside the process.
	boundThroughput = "throughput"
)

// defaultHeadroom is the share of the redelivery deadline that a full
// budget may take to drain. The rest is kept for what the measurement does
// not see: noticing the rebalance or claim, acking and committing, GC
// pauses, a noisy neighbour on the same cores, and a mix heavier than the
// sample.
const defaultHeadroom = 0.5

// defaultTailShare is the share of the redelivery deadline the slowest
// messages may take while a full budget drains (see [Inputs.Spread] and
// [Config.TailShare]).
const defaultTailShare = 0.75

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
	// parallelism production runs ([MeasureThroughput]).
	// Required.
	VerticesPerSecond float64 `json:"vertices_per_second"`
	// Deadline is the broker's redelivery deadline: Kafka's
	// Consumer.Group.Rebalance.Timeout, Redis Streams' idle-claim time.
	// Required.
	Deadline time.Duration `json:"deadline_ns"`
	// Headroom is the share of Deadline a full budget may take to drain,
	// in (0, 1]. 0 means 0.5: the rest of the deadline is kept for what
	// the measurement does not see (noticing the rebalance or claim,
	// acking, GC pauses, a noisy neighbour, a mix heavier than the
	// sample).
	Headroom float64 `json:"headroom"`
	// Spread is how much more the slow vertices of the mix cost than the
	// average one (as [MeasureThroughput] reports it); 0 means not
	// measured, and values below 1 count as 1. While a full budget drains, the messages in
	// flight share the cores, so a message whose vertices cost Spread
	// times the mean takes about Spread times the drain time. The drain
	// time is therefore held to TailShare / Spread of the deadline when
	// that is below Headroom: the slow messages, not the average, must
	// finish inside the deadline.
	Spread float64 `json:"spread"`
	// TailShare is the share of Deadline the slow messages may take, in
	// (0, 1]. 0 means 0.75. Used only with Spread.
	TailShare float64 `json:"tail_share"`
	// Parallelism is how many handlers ran at once when VerticesPerSecond
	// was measured ([WithParallelism]; GOMAXPROCS by default). One message
	// runs on one core, so VerticesPerSecond / Parallelism is how fast a
	// message goes alone: it sets [Bounds.SoloLimit]. 0 means 1
	// (VerticesPerSecond is a single core's).
	Parallelism int `json:"parallelism"`
}

// Bounds is a vertex budget with the bounds it came from, so a reader can
// tell which team moves it: when memory binds, a bigger container, fewer
// processes per container or a smaller broker prefetch raise the budget;
// when the deadline (or the tail guard) binds, a faster handler, more
// cores or a longer redelivery deadline do. [Recommend] computes one from
// measurements; an [AutoSizer] keeps one up to date from the handler calls
// it times.
type Bounds struct {
	// Budget is the smallest bound: the capacity to give
	// middleware.NewVertexBudget. An AutoSizer clamps it to [Floor,
	// Ceiling] and leaves it 0 until it has measured; the budget's
	// capacity differs from it by at most the hysteresis.
	Budget int64 `json:"budget"`
	// Binding names the bound that set Budget: "memory", "deadline" or,
	// from an AutoSizer, "tail" (its tail guard) or "throughput" (growing
	// it further did not raise the throughput); "" until measured. On a
	// tie it is "memory". When Budget differs from that bound, the
	// AutoSizer's floor or ceiling held it.
	Binding string `json:"binding"`
	// MemoryBound is how many in-flight vertices the memory holds:
	// (MemoryBytes / Processes − PrefetchBytes) / BytesPerVertex for
	// Recommend, the configured [Config.MemoryBound] for an AutoSizer (0:
	// none).
	MemoryBound int64 `json:"memory_bound"`
	// DeadlineBound is how many vertices drain within the deadline's
	// share: VerticesPerSecond × Deadline × the drain share (Headroom, or
	// TailShare / Spread if that is smaller; see [Inputs.Spread]). An
	// AutoSizer leaves it 0 until MinWindows windows were measured, unless
	// it held the budget's growth before that (then it is the bound of
	// the throughput measured so far).
	DeadlineBound int64 `json:"deadline_bound"`
	// TailBound is an AutoSizer's tail guard (see [Config.TailShare]); 0
	// until a window was measured, with the guard off, and from
	// Recommend.
	TailBound int64 `json:"tail_bound"`
	// VerticesPerSecond is the throughput the deadline bound was computed
	// from: the input of Recommend, or an AutoSizer's median of the recent
	// windows (vertices over core-busy time, so what Parallelism calls at
	// once would complete; 0 until a window was measured).
	VerticesPerSecond float64 `json:"vertices_per_second"`
	// SoloLimit is the largest message that finishes alone within
	// Deadline × Headroom: VerticesPerSecond / Parallelism (one core) ×
	// Deadline × Headroom. No budget makes a bigger message safe: alone on
	// one core it holds its delivery past that share of the deadline. Send
	// bigger ones elsewhere (the router's budget.max_message_vertices).
	// Recommend sets it; an AutoSizer leaves it 0.
	SoloLimit int64 `json:"solo_limit"`
}

// withDefaults fills in the defaults and validates in.
func (in Inputs) withDefaults() (Inputs, error) {
	if in.Processes == 0 {
		in.Processes = 1
	}
	if in.Headroom == 0 {
		in.Headroom = defaultHeadroom
	}
	if in.TailShare == 0 {
		in.TailShare = defaultTailShare
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
// (not measured) leaves headroom; a spread below 1 counts as 1.
func drainShare(headroom, spread, tailShare float64) float64 {
	if spread <= 0 || tailShare <= 0 {
		return headroom
	}
	return min(headroom, tailShare/max(spread, 1))
}

// deadlineBound returns how many vertices drain within share × deadline at
// verticesPerSecond, rounded down.
func deadlineBound(verticesPerSecond float64, deadline time.Duration, share float64) int64 {
	return floorInt64(verticesPerSecond * deadline.Seconds() * share)
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
// within the deadline's headroom: compare the sample's largest message with
// it.
//
// Invalid inputs fail with a [*spillway.FieldError] (matching
// [spillway.ErrInvalidConfig]) that names the field. If the prefetch leaves
// no memory for geometry or a bound is below one vertex, the error wraps
// [ErrInfeasible] and the returned Bounds still carry the bounds, for
// display. Recommend is a pure function.
func Recommend(in Inputs) (Bounds, error) {
	in, err := in.withDefaults()
	if err != nil {
		return Bounds{}, err
	}
	share := drainShare(in.Headroom, in.Spread, in.TailShare)
	geometry := in.MemoryBytes/int64(in.Processes) - in.PrefetchBytes
	b := Bounds{
		MemoryBound:       MemoryBound(in.MemoryBytes, in.Processes, in.PrefetchBytes, in.BytesPerVertex),
		DeadlineBound:     deadlineBound(in.VerticesPerSecond, in.Deadline, share),
		VerticesPerSecond: in.VerticesPerSecond,
	}
	b.Budget, b.Binding = b.MemoryBound, boundMemory
	if b.DeadlineBound < b.MemoryBound {
		b.Budget, b.Binding = b.DeadlineBound, boundDeadline
	}
	// One message runs on one core: the deadline bound of a single core.
	core := in.VerticesPerSecond / float64(max(in.Parallelism, 1))
	b.SoloLimit = deadlineBound(core, in.Deadline, in.Headroom)
	switch {
	case geometry <= 0:
		return b, fmt.Errorf("%w: prefetch_bytes (%d) leaves no memory for geometry out of %d bytes per process",
			ErrInfeasible, in.PrefetchBytes, in.MemoryBytes/int64(in.Processes))
	case b.MemoryBound < 1:
		return b, fmt.Errorf("%w: %d bytes per process hold no vertex at %.0f bytes per vertex",
			ErrInfeasible, geometry, in.BytesPerVertex)
	case b.DeadlineBound < 1:
		return b, fmt.Errorf("%w: not one vertex drains within %v × %.2f at %.3g vertices/s",
			ErrInfeasible, in.Deadline, share, in.VerticesPerSecond)
	}
	return b, nil
}
