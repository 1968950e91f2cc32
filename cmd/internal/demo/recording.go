package demo

import (
	"math"
	"runtime"
	"runtime/metrics"
	"slices"
	"time"
)

// Recording is everything one demo run measured.
type Recording struct {
	Started     time.Time         `json:"started"`
	Machine     Machine           `json:"machine"`
	Options     Options           `json:"options"`
	Stream      StreamInfo        `json:"stream"`
	Calibration Calibration       `json:"calibration"`
	Groups      []*GroupRecording `json:"groups"`
}

// Machine describes where the demo ran.
type Machine struct {
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
	Race       bool   `json:"race"`
}

func thisMachine() Machine {
	return Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPUs: runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(), Race: raceEnabled}
}

// StreamInfo summarises the generated stream.
type StreamInfo struct {
	Messages      int   `json:"messages"`
	Pings         int   `json:"pings"`
	Parcels       int   `json:"parcels"`
	Heavies       int   `json:"heavies"`
	Vertices      int64 `json:"vertices"`
	HeavyVertices int64 `json:"heavy_vertices"`
}

func streamInfo(s *Stream) StreamInfo {
	return StreamInfo{
		Messages: len(s.Messages), Pings: s.Count[KindPing], Parcels: s.Count[KindParcel], Heavies: s.Count[KindHeavy],
		Vertices: s.TotalVertices(), HeavyVertices: s.Vertices[KindHeavy],
	}
}

// Sample is one point of a group's time series. T is seconds since the
// group started producing.
type Sample struct {
	T            float64 `json:"t"`
	Inflight     int64   `json:"inflight"`       // vertices in handlers, all members
	Budget       int64   `json:"budget"`         // budget capacity, summed over members (0: no budget)
	InUse        int64   `json:"in_use"`         // budget in use
	Heap         uint64  `json:"heap"`           // live heap objects, bytes
	Completed    int64   `json:"completed"`      // handler completions so far
	Vertices     int64   `json:"vertices"`       // vertices completed so far
	Shed         int64   `json:"shed"`           // messages shed so far
	Redeliveries int64   `json:"redeliveries"`   // handler runs after a message's first (not retries of a failure)
	Duplicates   int64   `json:"duplicates"`     // completions after a message's first
	Lag          int64   `json:"lag"`            // uncommitted messages; -1 unknown
	Members      int     `json:"members"`        // consumers running
	Accounted    int     `json:"accounted"`      // messages completed, shed or dead-lettered
	Waiting      int     `json:"waiting"`        // messages waiting for budget
	WaitOldestMS float64 `json:"wait_oldest_ms"` // the oldest waiter's wait
}

// Latency is one completed message: when (seconds since the group
// started) and how long after its publication.
type Latency struct {
	T       float64 `json:"t"`
	Seconds float64 `json:"seconds"`
	Kind    Kind    `json:"kind"`
}

// Event is something that happened during a group's run.
type Event struct {
	T    float64 `json:"t"`
	What string  `json:"what"`
}

// GroupRecording is what one consumer group did.
type GroupRecording struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Members     int    `json:"members"`

	Series    []Sample  `json:"series"`
	Latencies []Latency `json:"-"`
	// Unfinished are the messages published but never done with (not
	// completed, shed or dead-lettered), with their age when the run ended.
	Unfinished []Latency      `json:"-"`
	Events     []Event        `json:"events"`
	Sessions   []SessionEvent `json:"sessions"`

	Published      int            `json:"published"`
	Attempts       int            `json:"attempts"`     // handler runs
	Completions    int            `json:"completions"`  // successful handler runs
	Unique         int            `json:"unique"`       // messages completed at least once
	Duplicates     int            `json:"duplicates"`   // completions beyond a message's first
	DupVertices    int64          `json:"dup_vertices"` // vertices processed again
	Redeliveries   int            `json:"redeliveries"` // handler runs beyond a message's first, except Retries
	Retries        int            `json:"retries"`      // second runs after an injected failure
	Failures       int            `json:"failures"`     // injected first-attempt failures
	Abandoned      int            `json:"abandoned"`    // runs stopped at teardown
	Shed           int            `json:"shed"`
	ShedByReason   map[string]int `json:"shed_by_reason,omitempty"`
	DeadLettered   int            `json:"dead_lettered"`
	Deferred       int            `json:"deferred"`
	Revocations    uint64         `json:"revocations"`     // waiting messages that stepped aside (Spillway)
	LateMarks      uint64         `json:"late_marks"`      // acks committed during a rebalance (Spillway)
	Resizes        int            `json:"resizes"`         // auto-sizer resizes
	Evictions      int            `json:"evictions"`       // sessions resumed under a new member id
	LostMembership int            `json:"lost_membership"` // Sarama errors: unknown member, illegal generation
	Accounted      int            `json:"accounted"`
	VerticesDone   int64          `json:"vertices_done"` // vertices of unique completions

	// JoinedAt, Noticed and Rebalance: when the second member joined and
	// when the first member learned of the rebalance on the boundaries
	// topic (its session ended), in seconds since start, and how long from
	// then until the new member had its first session: the rebalance the
	// join forced, as held up by the work in flight. -1 if never.
	JoinedAt  float64 `json:"joined_at"`
	Noticed   float64 `json:"noticed"`
	Rebalance float64 `json:"rebalance_seconds"`
	// Drained is when every message was accounted for (seconds since
	// start); -1 if that did not happen before the drain limit.
	Drained float64 `json:"drained"`
	// Ended is when measuring stopped (seconds since start).
	Ended float64 `json:"ended"`
}

// latencyQuantile returns the q-quantile of the latencies of messages
// completed in [from, to) seconds, over kinds (nil: all), and how many
// there were. With unfinished, messages never done count too, with their
// age at the end of the run: a lower bound of their latency.
func (g *GroupRecording) latencyQuantile(q, from, to float64, unfinished bool, kinds ...Kind) (float64, int) {
	var xs []float64
	ls := g.Latencies
	if unfinished {
		ls = append(slices.Clip(ls), g.Unfinished...)
	}
	for _, l := range ls {
		if l.T < from || l.T >= to {
			continue
		}
		if len(kinds) > 0 && !slices.Contains(kinds, l.Kind) {
			continue
		}
		xs = append(xs, l.Seconds)
	}
	return quantile(xs, q), len(xs)
}

// quantile returns the q-quantile of xs (nearest rank), sorting xs; NaN
// for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// heapBytes reads the live heap objects' size from runtime/metrics.
func heapBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindUint64 {
		return s[0].Value.Uint64()
	}
	return 0
}
