package scaling

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// The axes the checks run along.
const (
	AxisParallelism = "parallelism"
	AxisHandlers    = "handlers"
	AxisBudget      = "budget"
)

// Check compares Spillway's CPU-per-message ratio (to the bare
// subscriber's, in the same cell) along one axis, everything else fixed:
// the ratio at the axis's smallest value against the highest ratio at any
// larger value.
type Check struct {
	Axis   string `json:"axis"`
	Broker string `json:"broker"`
	Cost   string `json:"cost"`
	// Fixed names the other settings, e.g. "handlers 1, budget 200000".
	Fixed string `json:"fixed"`
	// From is the smallest value and FromRatio the ratio there; To is
	// the larger value with the highest ratio, ToRatio.
	From      int64   `json:"from"`
	FromRatio float64 `json:"from_ratio"`
	To        int64   `json:"to"`
	ToRatio   float64 `json:"to_ratio"`
	// Growth is how much Spillway's extra CPU per message (its CPU minus
	// the bare subscriber's, in µs) rose from From to To, and Noise the
	// larger run-to-run spread of the two cells (Result.CPUNoise).
	Growth float64 `json:"growth_us"`
	Noise  float64 `json:"noise_us"`
	// Grew is true when ToRatio exceeds FromRatio by more than the
	// tolerance and the extra CPU per message rose by more than Noise: a
	// rise the runs of one cell already differ by is not growth.
	Grew bool `json:"grew"`
}

// axisValue reads the value of axis from a result, and key names the
// other settings of its cell.
func axisValue(r Result, axis string) (value int64, key string) {
	switch axis {
	case AxisParallelism:
		return int64(r.Parallelism), fmt.Sprintf("handlers %d, budget %d", r.Handlers, r.Budget)
	case AxisHandlers:
		return int64(r.Handlers), fmt.Sprintf("%s %d, budget %d", parallelName(r.Broker), r.Parallelism, r.Budget)
	default:
		return r.Budget, fmt.Sprintf("%s %d, handlers %d", parallelName(r.Broker), r.Parallelism, r.Handlers)
	}
}

// MinJudgedRuns is the fewest runs per cell from which a sweep judges
// growth: the noise a check compares against is the spread between the
// runs of one cell, and one run has none to measure.
const MinJudgedRuns = 2

// check fills Checks, Pass and Verdict. With fewer than MinJudgedRuns runs
// per cell (rep.Options.Runs) the checks are listed but none is judged to
// grow, and the verdict says so: a rise cannot be told from noise that was
// not measured.
func (rep *Report) check(tolerance float64) {
	judged := rep.Options.Runs >= MinJudgedRuns
	rep.Checks = nil
	for _, axis := range []string{AxisParallelism, AxisHandlers, AxisBudget} {
		type group struct {
			broker, cost, fixed string
			points              map[int64]Result
		}
		var groups []*group
		find := map[string]*group{}
		for _, r := range rep.Results {
			if r.Consumer != ConsumerSpillway || r.CPURatio <= 0 {
				continue
			}
			v, fixed := axisValue(r, axis)
			k := r.Broker + "|" + r.Cost + "|" + fixed
			g := find[k]
			if g == nil {
				g = &group{broker: r.Broker, cost: r.Cost, fixed: fixed, points: map[int64]Result{}}
				find[k] = g
				groups = append(groups, g)
			}
			g.points[v] = r
		}
		for _, g := range groups {
			if len(g.points) < 2 {
				continue
			}
			var vals []int64
			for v := range g.points {
				vals = append(vals, v)
			}
			slices.Sort(vals)
			from := g.points[vals[0]]
			c := Check{Axis: axis, Broker: g.broker, Cost: g.cost, Fixed: g.fixed, From: vals[0], FromRatio: from.CPURatio}
			var to Result
			for _, v := range vals[1:] {
				if r := g.points[v]; c.To == 0 || r.CPURatio > c.ToRatio {
					c.To, c.ToRatio, to = v, r.CPURatio, r
				}
			}
			c.Growth = extraCPU(to) - extraCPU(from)
			c.Noise = max(from.CPUNoise, to.CPUNoise)
			c.Grew = judged && c.ToRatio > c.FromRatio*(1+tolerance) && c.Growth > c.Noise
			rep.Checks = append(rep.Checks, c)
		}
	}
	rep.Pass, rep.Verdict = verdict(rep.Checks, tolerance, rep.Options.Runs)
}

// extraCPU is Spillway's CPU per message minus the bare subscriber's in
// r's cell, in µs.
func extraCPU(r Result) float64 {
	return r.CPUPerMessage - r.CPUPerMessage/r.CPURatio
}

// verdict sums the checks up in one line; runs is the sweep's runs per
// cell. Only a measured rise fails: with too few runs to estimate the
// noise the sweep passes unjudged.
func verdict(checks []Check, tolerance float64, runs int) (bool, string) {
	if len(checks) == 0 {
		return true, "verdict: NOT CHECKED: no axis has two values to compare"
	}
	if runs < MinJudgedRuns {
		return true, fmt.Sprintf("verdict: not judged (needs --runs ≥ %d to estimate noise; this sweep ran %d per cell): "+
			"%d checks listed, none judged", MinJudgedRuns, runs, len(checks))
	}
	var grew []Check
	for _, c := range checks {
		if c.Grew {
			grew = append(grew, c)
		}
	}
	if len(grew) == 0 {
		return true, fmt.Sprintf("verdict: PASS: Spillway's CPU per message, as a ratio to the bare subscriber's, "+
			"does not grow with partitions/consumers, handlers or budget size (%d checks, tolerance +%.0f%% beyond the runs' spread)",
			len(checks), 100*tolerance)
	}
	worst := slices.MaxFunc(grew, func(a, b Check) int { return cmp.Compare(a.ToRatio/a.FromRatio, b.ToRatio/b.FromRatio) })
	var axes []string
	for _, c := range grew {
		if !slices.Contains(axes, c.Axis) {
			axes = append(axes, c.Axis)
		}
	}
	return false, fmt.Sprintf("verdict: FAIL: the CPU-per-message ratio grows with %s in %d of %d checks (tolerance +%.0f%% beyond the runs' spread); "+
		"worst: %s %s, %s: %.2fx at %s %d, %.2fx at %d",
		strings.Join(axes, ", "), len(grew), len(checks), 100*tolerance,
		worst.Broker, worst.Cost, worst.Fixed, worst.FromRatio, axisLabel(worst.Axis, worst.Broker), worst.From, worst.ToRatio, worst.To)
}

// axisLabel names an axis for a broker.
func axisLabel(axis, broker string) string {
	if axis == AxisParallelism {
		return parallelName(broker)
	}
	return axis
}
