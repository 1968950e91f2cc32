package demo

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// Summary is the machine-readable result of a demo run ("spillway demo
// --json"). Field names are stable.
type Summary struct {
	Version     int            `json:"version"`
	Started     time.Time      `json:"started"`
	Machine     Machine        `json:"machine"`
	Options     Options        `json:"options"`
	Stream      StreamInfo     `json:"stream"`
	Calibration Calibration    `json:"calibration"`
	Groups      []GroupSummary `json:"groups"`
	Report      string         `json:"report,omitempty"` // the HTML report's path
}

// GroupSummary condenses one group's run. Times are seconds; -1 means
// "did not happen".
type GroupSummary struct {
	Name        string `json:"name"`
	Description string `json:"description"`

	Messages     int `json:"messages"`
	Processed    int `json:"processed"`     // distinct messages completed
	Shed         int `json:"shed"`          // dropped on purpose (positions only)
	DeadLettered int `json:"dead_lettered"` // failed for good
	Unprocessed  int `json:"unprocessed"`   // none of the above when the run ended

	Duplicates     int    `json:"duplicates"`      // messages whose work was done again
	DupVertices    int64  `json:"dup_vertices"`    // vertices processed again
	Redeliveries   int    `json:"redeliveries"`    // handler runs beyond a message's first, not counting Retries
	Retries        int    `json:"retries"`         // second runs of a message whose first attempt failed
	Evictions      int    `json:"evictions"`       // members dropped from a group
	LostMembership int    `json:"lost_membership"` // Sarama errors: unknown member or generation
	Revocations    uint64 `json:"revocations"`     // waiting messages that stepped aside
	LateMarks      uint64 `json:"late_marks"`      // acks committed during a rebalance

	RebalanceSeconds float64 `json:"rebalance_seconds"` // second member joined -> its first session
	LateRebalance    bool    `json:"late_rebalance"`    // longer than the deadline

	MaxInflightVertices int64   `json:"max_inflight_vertices"`
	StartBudget         int64   `json:"start_budget"` // 0: no budget
	EndBudget           int64   `json:"end_budget"`
	Resizes             int     `json:"resizes"`
	MemoryBound         int64   `json:"memory_bound"`
	PeakHeapBytes       uint64  `json:"peak_heap_bytes"`
	PeakLag             int64   `json:"peak_lag"`
	LatencyP50          float64 `json:"latency_p50"`
	LatencyP99          float64 `json:"latency_p99"`
	LatencyMax          float64 `json:"latency_max"`
	BoundariesP99       float64 `json:"boundaries_latency_p99"` // parcels and heavies
	PositionsP99        float64 `json:"positions_latency_p99"`  // pings
	DrainSeconds        float64 `json:"drain_seconds"`          // start -> everything accounted for
	VerticesPerSecond   float64 `json:"vertices_per_second"`    // distinct vertices / time to drain (or the run)
}

// Summarize condenses the recording.
func (r *Recording) Summarize() Summary {
	s := Summary{Version: 1, Started: r.Started, Machine: r.Machine, Options: r.Options, Stream: r.Stream, Calibration: r.Calibration}
	for _, g := range r.Groups {
		s.Groups = append(s.Groups, g.summarize(r.Calibration.MemoryBound, r.Options.Deadline, r.Options.Broker != "redis"))
	}
	return s
}

// summarize condenses g; sessions says whether the broker has group
// sessions (Kafka), so a joining member forces a rebalance.
func (g *GroupRecording) summarize(memoryBound int64, deadline time.Duration, sessions bool) GroupSummary {
	s := GroupSummary{
		Name: g.Name, Description: g.Description, Messages: g.Published, Processed: g.Unique, Shed: g.Shed,
		DeadLettered: g.DeadLettered, Unprocessed: g.Published - g.Accounted,
		Duplicates: g.Duplicates, DupVertices: g.DupVertices, Redeliveries: g.Redeliveries, Retries: g.Retries, Evictions: g.Evictions,
		LostMembership: g.LostMembership, Revocations: g.Revocations, LateMarks: g.LateMarks,
		RebalanceSeconds: g.Rebalance, Resizes: g.Resizes, MemoryBound: memoryBound, DrainSeconds: g.Drained,
		PeakLag: -1,
	}
	switch {
	case !sessions:
		s.RebalanceSeconds = -1
	case g.JoinedAt >= 0 && g.Rebalance < 0:
		// The second member never got a session while we watched.
		s.RebalanceSeconds = g.Ended - g.JoinedAt
		s.LateRebalance = true
	default:
		s.LateRebalance = g.Rebalance > deadline.Seconds()
	}
	for i, x := range g.Series {
		s.MaxInflightVertices = max(s.MaxInflightVertices, x.Inflight)
		s.PeakHeapBytes = max(s.PeakHeapBytes, x.Heap)
		s.PeakLag = max(s.PeakLag, x.Lag)
		if i == 0 {
			s.StartBudget = x.Budget
		}
		s.EndBudget = x.Budget
	}
	end := math.Inf(1)
	s.LatencyP50, _ = g.latencyQuantile(0.5, 0, end, true)
	s.LatencyP99, _ = g.latencyQuantile(0.99, 0, end, true)
	s.LatencyMax, _ = g.latencyQuantile(1, 0, end, true)
	s.BoundariesP99, _ = g.latencyQuantile(0.99, 0, end, true, KindParcel, KindHeavy)
	s.PositionsP99, _ = g.latencyQuantile(0.99, 0, end, true, KindPing)
	span := g.Drained
	if span < 0 {
		span = g.Ended
	}
	if span > 0 {
		s.VerticesPerSecond = float64(g.VerticesDone) / span
	}
	for _, f := range []*float64{&s.LatencyP50, &s.LatencyP99, &s.LatencyMax, &s.BoundariesP99, &s.PositionsP99} {
		if math.IsNaN(*f) {
			*f = -1
		}
	}
	return s
}

// Failed reports whether the group showed the failure the demo is about:
// work done twice, a member evicted, or a rebalance past the deadline.
func (s GroupSummary) Failed() bool {
	return s.Duplicates > 0 || s.Evictions > 0 || s.LostMembership > 0 || s.LateRebalance
}

// Table returns the summary as rows of cells: a header row with the group
// names, then one row per measure, its name first.
func (s Summary) Table() [][]string {
	head := []string{""}
	for _, g := range s.Groups {
		head = append(head, g.Name)
	}
	out := [][]string{head}
	row := func(name string, f func(GroupSummary) string) {
		cells := []string{name}
		for _, g := range s.Groups {
			cells = append(cells, f(g))
		}
		out = append(out, cells)
	}
	row("messages published", func(g GroupSummary) string { return fmt.Sprint(g.Messages) })
	row("processed", func(g GroupSummary) string { return fmt.Sprint(g.Processed) })
	row("shed (positions only)", func(g GroupSummary) string { return fmt.Sprint(g.Shed) })
	row("dead-lettered", func(g GroupSummary) string { return fmt.Sprint(g.DeadLettered) })
	row("not done at the end", func(g GroupSummary) string { return fmt.Sprint(g.Unprocessed) })
	row("duplicates (work done twice)", func(g GroupSummary) string {
		return fmt.Sprintf("%d (%s vertices)", g.Duplicates, Compact(float64(g.DupVertices)))
	})
	row("retries after a failed attempt", func(g GroupSummary) string { return fmt.Sprint(g.Retries) })
	row("redeliveries (rebalance, lost ack)", func(g GroupSummary) string { return fmt.Sprint(g.Redeliveries) })
	row("evictions", func(g GroupSummary) string { return fmt.Sprint(g.Evictions) })
	row("rebalance (deadline "+s.Options.Deadline.String()+")", func(g GroupSummary) string {
		if g.RebalanceSeconds < 0 {
			return "-"
		}
		late := ""
		if g.LateRebalance {
			late = " LATE"
		}
		return fmt.Sprintf("%.1fs%s", g.RebalanceSeconds, late)
	})
	row("max in-flight vertices", func(g GroupSummary) string { return Compact(float64(g.MaxInflightVertices)) })
	row("budget, all members: start -> end", func(g GroupSummary) string {
		if g.StartBudget == 0 {
			return "none"
		}
		return Compact(float64(g.StartBudget)) + " -> " + Compact(float64(g.EndBudget))
	})
	row("peak heap", func(g GroupSummary) string { return fmt.Sprintf("%.0f MiB", float64(g.PeakHeapBytes)/(1<<20)) })
	row("peak lag (messages)", func(g GroupSummary) string { return fmt.Sprint(g.PeakLag) })
	row("latency p50 / p99", func(g GroupSummary) string {
		return fmt.Sprintf("%s / %s", secs(g.LatencyP50), secs(g.LatencyP99))
	})
	row("p99 positions / boundaries", func(g GroupSummary) string {
		return fmt.Sprintf("%s / %s", secs(g.PositionsP99), secs(g.BoundariesP99))
	})
	row("everything done after", func(g GroupSummary) string {
		if g.DrainSeconds < 0 {
			return "never"
		}
		return fmt.Sprintf("%.1fs", g.DrainSeconds)
	})
	row("vertices/s (distinct work)", func(g GroupSummary) string { return Compact(g.VerticesPerSecond) })
	return out
}

// WriteTable prints the summary as an aligned table, one column per group.
func (s Summary) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i, r := range s.Table() {
		for j, c := range r {
			if j > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c)
		}
		fmt.Fprintln(tw)
		if i == 0 {
			fmt.Fprintln(tw, strings.Repeat("-", 28)+strings.Repeat("\t"+strings.Repeat("-", 18), len(r)-1))
		}
	}
	return tw.Flush()
}

func secs(s float64) string {
	switch {
	case s < 0:
		return "-"
	case s < 0.001:
		return "<1ms"
	case s < 1:
		return fmt.Sprintf("%.0fms", s*1000)
	}
	return fmt.Sprintf("%.1fs", s)
}

// Compact writes n with a k or M suffix (1.5k, 12M), as the demo's and the
// scaling sweep's tables show counts and rates.
func Compact(n float64) string {
	switch a := math.Abs(n); {
	case a >= 10e6:
		return fmt.Sprintf("%.0fM", n/1e6)
	case a >= 1e6:
		return fmt.Sprintf("%.1fM", n/1e6)
	case a >= 10e3:
		return fmt.Sprintf("%.0fk", n/1e3)
	case a >= 1e3:
		return fmt.Sprintf("%.1fk", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}
