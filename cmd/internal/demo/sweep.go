package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/refwork"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/sizing"
)

// SweepOptions configures the goodput sweep: the same backlog of mixed
// geometry processed under fixed budgets from small to large and under an
// auto-sized one, in process (no broker), every message admitted in FIFO
// order against a middleware.VertexBudget as the router does.
type SweepOptions struct {
	Seed          uint64        `json:"seed"`
	Deadline      time.Duration `json:"deadline"`       // the redelivery deadline processing must stay inside
	HeavyVertices int           `json:"heavy_vertices"` // vertices per heavy multipolygon
	HeavyShare    float64       `json:"heavy_share"`    // one heavy alone takes this share of Deadline on one core
	// Work is the CPU time the backlog takes on one core: the run takes
	// about Work / cores.
	Work time.Duration `json:"work"`
	// Factors are the fixed budgets, as multiples of the largest heavy
	// message, so the grid does not move with the calibration.
	Factors []float64 `json:"factors"`
	// Window is the auto-sizer's measuring window.
	Window time.Duration `json:"window"`
	// Rounds is how many times every budget runs. Rounds take turns (each
	// round runs every budget once), so load from elsewhere on a shared
	// machine hits every budget alike; the medians count.
	Rounds int `json:"rounds"`

	OnPhase func(string) `json:"-"`
}

// DefaultSweepOptions are the defaults of "spillway demo --sweep".
func DefaultSweepOptions() SweepOptions {
	return SweepOptions{
		Seed:          1,
		Deadline:      3 * time.Second,
		HeavyVertices: 20_000,
		HeavyShare:    0.2,
		Work:          10 * time.Second,
		Factors:       []float64{0.5, 1, 2, 3, 4, 6, 8},
		Window:        time.Second,
		Rounds:        3,
	}
}

// SweepRun is one budget's result.
type SweepRun struct {
	Name         string  `json:"name"`        // "fixed", "auto (from the calibrated budget)", "auto (from the smallest budget)"
	Factor       float64 `json:"factor"`      // fixed budgets: the multiple of the deadline bound
	Budget       int64   `json:"budget"`      // starting capacity
	EndBudget    int64   `json:"end_budget"`  // capacity at the end
	MeanBudget   float64 `json:"mean_budget"` // time-weighted mean capacity
	Resizes      uint64  `json:"resizes"`     // auto only
	Seconds      float64 `json:"seconds"`     // wall time of the run
	VerticesPS   float64 `json:"vertices_per_second"`
	GoodputPS    float64 `json:"goodput"`          // vertices/s of messages done within the deadline
	MaxProcess   float64 `json:"max_processing"`   // longest admission-to-completion, seconds (median over rounds)
	WorstProcess float64 `json:"worst_processing"` // the longest of any round
	P99Process   float64 `json:"p99_processing"`
	Late         int     `json:"late"`        // messages whose processing exceeded the deadline
	MaxWait      float64 `json:"max_wait"`    // longest wait for admission, seconds
	InDeadline   bool    `json:"in_deadline"` // MaxProcess <= Deadline
	Rounds       int     `json:"rounds"`
	ShareOfBest  float64 `json:"share_of_best"` // goodput / the best fixed budget's goodput within the deadline
	// RoundGoodput is each round's goodput, in the order the rounds ran.
	RoundGoodput []float64 `json:"round_goodput"`
	// RoundShare is each round's goodput over the best fixed budget's in
	// the same round: a round slowed by other load slows both.
	RoundShare []float64 `json:"round_share_of_best"`
	// Trace is what the auto-sizer did in the round of median goodput:
	// every resize, with the seconds since the run began.
	Trace []SweepResize `json:"trace,omitempty"`
}

// SweepResize is one resize of an auto-sized run.
type SweepResize struct {
	At      float64 `json:"at"` // seconds since the run began
	To      int64   `json:"to"`
	Binding string  `json:"binding"`
}

// SweepResult is the whole sweep.
type SweepResult struct {
	Machine     Machine      `json:"machine"`
	Options     SweepOptions `json:"options"`
	Messages    int          `json:"messages"`
	Vertices    int64        `json:"vertices"`
	Passes      int          `json:"passes"`
	RatePS      float64      `json:"calibrated_vertices_per_second"`
	Spread      float64      `json:"calibrated_spread"`
	DrainShare  float64      `json:"drain_share"`
	DeadlineBnd int64        `json:"deadline_bound"`
	Runs        []SweepRun   `json:"runs"`
	// BestFixed is the index in Runs of the fixed budget with the highest
	// goodput among those that stayed inside the deadline (-1: none).
	BestFixed int `json:"best_fixed"`
}

type sweepMsg struct {
	payload  []byte
	vertices int64
}

// sweepCalibrationHeavies is how many of the backlog's heavy messages the
// calibration measures: enough to see the slow ones.
const sweepCalibrationHeavies = 16

// Sweep runs the goodput sweep.
func Sweep(ctx context.Context, o SweepOptions) (*SweepResult, error) {
	d := DefaultSweepOptions()
	if o.Deadline == 0 {
		o.Deadline = d.Deadline
	}
	if o.HeavyVertices == 0 {
		o.HeavyVertices = d.HeavyVertices
	}
	if o.HeavyShare == 0 {
		o.HeavyShare = d.HeavyShare
	}
	if o.Work == 0 {
		o.Work = d.Work
	}
	if len(o.Factors) == 0 {
		o.Factors = d.Factors
	}
	if o.Window == 0 {
		o.Window = d.Window
	}
	if o.Seed == 0 {
		o.Seed = d.Seed
	}
	if o.Rounds == 0 {
		o.Rounds = d.Rounds
	}
	if o.Deadline <= 0 || o.Work <= 0 || o.HeavyShare <= 0 || o.HeavyShare > 1 || o.Window <= 0 {
		return nil, fmt.Errorf("%w: sweep: deadline, work and window must be positive, heavy share in (0, 1]", ErrBadOptions)
	}
	phase := func(format string, args ...any) {
		if o.OnPhase != nil {
			o.OnPhase(fmt.Sprintf(format, args...))
		}
	}
	phase("loading geometry and calibrating")
	g, err := LoadGeometry()
	if err != nil {
		return nil, err
	}
	res := &SweepResult{Machine: thisMachine(), Options: o, BestFixed: -1}
	// Calibrate as the demo does: passes so a heavy takes HeavyShare of
	// the deadline alone, then the throughput with every core busy.
	do := DefaultOptions()
	do.Deadline, do.HeavyVertices, do.HeavyShare = o.Deadline, o.HeavyVertices, o.HeavyShare
	do.CalibrationRepeats = 2
	rng := rand.New(rand.NewPCG(o.Seed, 7))
	var heavies [][]byte
	var heavyVertices []int64
	for range sweepCalibrationHeavies {
		p, v, err := g.HeavyPayload(rng.IntN(len(g.Polygons)), o.HeavyVertices)
		if err != nil {
			return nil, err
		}
		heavies, heavyVertices = append(heavies, p), append(heavyVertices, int64(v))
	}
	cal, err := calibrate(ctx, g, heavies, nil, 0, do)
	if err != nil {
		return nil, err
	}
	res.Passes, res.RatePS, res.DeadlineBnd = cal.Passes, cal.VerticesPerSecond, cal.DeadlineBound
	res.Spread, res.DrainShare = cal.Spread, cal.DrainShare

	// The backlog: by vertices about two thirds heavy, the rest parcels
	// and pings, shuffled, sized to Work of CPU time.
	perVertex := cal.HeavySeconds / float64(o.HeavyVertices)
	total := int64(o.Work.Seconds() / perVertex)
	var msgs []sweepMsg
	var sum int64
	for i, p := range heavies {
		msgs = append(msgs, sweepMsg{p, heavyVertices[i]})
		sum += heavyVertices[i]
	}
	for i := 0; sum < total*2/3; i++ {
		p, v, err := g.HeavyPayload(rng.IntN(len(g.Polygons)), o.HeavyVertices)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, sweepMsg{p, int64(v)})
		heavyVertices = append(heavyVertices, int64(v))
		sum += int64(v)
	}
	// The unit of the fixed budgets: the largest heavy message, so that a
	// budget of two fits any two of them.
	unit := slices.Max(heavyVertices)
	for sum < total*99/100 {
		f := g.Parcels[rng.IntN(len(g.Parcels))]
		msgs = append(msgs, sweepMsg{f.Geometry, int64(f.Vertices)})
		sum += int64(f.Vertices)
	}
	for sum < total {
		msgs = append(msgs, sweepMsg{fmt.Appendf(nil, `{"type":"Point","coordinates":[%.5f,%.5f]}`, rng.Float64()*50-120, rng.Float64()*20+25), 1})
		sum++
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	res.Messages, res.Vertices = len(msgs), sum

	type config struct {
		name   string
		factor float64
		budget int64
		auto   bool
	}
	var configs []config
	var budgets []int64
	for _, f := range o.Factors {
		b := max(1, int64(f*float64(unit)))
		budgets = append(budgets, b)
		configs = append(configs, config{name: "fixed", factor: f, budget: b})
	}
	lo, hi := slices.Min(budgets), slices.Max(budgets)
	configs = append(configs,
		config{name: autoCalibrated, budget: min(max(cal.DeadlineBound, lo), hi), auto: true},
		config{name: autoSmallest, budget: lo, auto: true})
	runs := make([][]SweepRun, len(configs))
	for round := range o.Rounds {
		for i, c := range configs {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			phase("round %d/%d: %s budget, %d vertices", round+1, o.Rounds, c.name, c.budget)
			var acfg *sizing.Config
			if c.auto {
				acfg = &sizing.Config{
					Deadline: o.Deadline, Floor: lo, Ceiling: hi, Window: o.Window,
					Windows: 5, MinWindows: 3, MinBusy: o.Window / 10,
				}
			}
			r := runSweep(ctx, msgs, cal.Passes, o, c.budget, acfg)
			r.Name, r.Factor = c.name, c.factor
			runs[i] = append(runs[i], r)
		}
	}
	for _, rs := range runs {
		res.Runs = append(res.Runs, medianRun(rs, o.Deadline))
	}
	best := 0.0
	for i, r := range res.Runs {
		if r.Name == "fixed" && r.InDeadline && r.GoodputPS > best {
			best, res.BestFixed = r.GoodputPS, i
		}
	}
	for i := range res.Runs {
		if best > 0 {
			r := &res.Runs[i]
			r.ShareOfBest = r.GoodputPS / best
			for round, g := range r.RoundGoodput {
				r.RoundShare = append(r.RoundShare, g/res.Runs[res.BestFixed].RoundGoodput[round])
			}
		}
	}
	return res, nil
}

// medianRun condenses the rounds of one budget: medians of the rates and
// of each round's longest processing time, and the worst processing time
// of any round.
func medianRun(rs []SweepRun, deadline time.Duration) SweepRun {
	med := func(f func(SweepRun) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		return quantile(xs, 0.5)
	}
	out := rs[0]
	out.Rounds = len(rs)
	for _, r := range rs {
		out.RoundGoodput = append(out.RoundGoodput, r.GoodputPS)
	}
	byGoodput := slices.Clone(rs)
	slices.SortFunc(byGoodput, func(a, b SweepRun) int { return cmp.Compare(a.GoodputPS, b.GoodputPS) })
	out.Trace = byGoodput[len(rs)/2].Trace
	out.Seconds = med(func(r SweepRun) float64 { return r.Seconds })
	out.VerticesPS = med(func(r SweepRun) float64 { return r.VerticesPS })
	out.GoodputPS = med(func(r SweepRun) float64 { return r.GoodputPS })
	out.MaxProcess = med(func(r SweepRun) float64 { return r.MaxProcess })
	out.P99Process = med(func(r SweepRun) float64 { return r.P99Process })
	out.MaxWait = med(func(r SweepRun) float64 { return r.MaxWait })
	out.MeanBudget = med(func(r SweepRun) float64 { return r.MeanBudget })
	out.EndBudget = int64(med(func(r SweepRun) float64 { return float64(r.EndBudget) }))
	out.Late = int(med(func(r SweepRun) float64 { return float64(r.Late) }))
	out.Resizes = uint64(med(func(r SweepRun) float64 { return float64(r.Resizes) }))
	out.WorstProcess = 0
	for _, r := range rs {
		out.WorstProcess = max(out.WorstProcess, r.MaxProcess)
	}
	out.InDeadline = out.MaxProcess <= deadline.Seconds()
	return out
}

// runSweep processes msgs once: each admitted in order against a budget of
// capacity b (auto-sized when acfg is set), then run on its own goroutine.
func runSweep(ctx context.Context, msgs []sweepMsg, passes int, o SweepOptions, b int64, acfg *sizing.Config) SweepRun {
	runtime.GC()
	budget, err := middleware.NewVertexBudget(b)
	if err != nil {
		panic(err) // the callers size b from positive measurements
	}
	var (
		sizer   *sizing.AutoSizer
		resizes atomic.Uint64
		trace   []SweepResize // written with the sizer's lock held
		start   = time.Now()
	)
	if acfg != nil {
		countResize := sizing.WithOnResize(func(_, to int64, b sizing.Bounds) {
			resizes.Add(1)
			trace = append(trace, SweepResize{At: time.Since(start).Seconds(), To: to, Binding: b.Binding})
		})
		if sizer, err = sizing.New(budget, *acfg, countResize); err != nil {
			panic(err) // the configuration is built above
		}
	}
	r := SweepRun{Budget: b}
	var (
		mu       sync.Mutex
		process  []float64
		good     int64
		all      int64
		maxWait  time.Duration
		wg       sync.WaitGroup
		capSum   float64
		lastCap  = b
		lastTime = start
	)
	noteCap := func() {
		now := time.Now()
		c := budget.Stats().Capacity
		capSum += float64(lastCap) * now.Sub(lastTime).Seconds()
		lastCap, lastTime = c, now
	}
	for _, m := range msgs {
		asked := time.Now()
		p, err := budget.Acquire(ctx, m.vertices)
		if err != nil {
			break
		}
		maxWait = max(maxWait, time.Since(asked))
		wg.Add(1)
		go func() {
			defer wg.Done()
			admitted := time.Now()
			handle := func(*message.Message) ([]*message.Message, error) {
				_, err := refwork.Process(refwork.Full, m.payload, passes)
				return nil, err
			}
			if sizer != nil {
				// The sizer measures the call at the charge the budget
				// admitted, as it does behind the router's budget.
				msg := message.NewMessage("", nil)
				msg.SetContext(cost.WithAdmitted(ctx, cost.Charge{Vertices: m.vertices, Messages: 1, Source: cost.SourceComputed}))
				handle = sizer.Middleware(handle)
				_, _ = handle(msg)
			} else {
				_, _ = handle(nil)
			}
			took := time.Since(admitted)
			p.Release()
			mu.Lock()
			defer mu.Unlock()
			noteCap()
			process = append(process, took.Seconds())
			all += m.vertices
			if took <= o.Deadline {
				good += m.vertices
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	noteCap()
	mu.Unlock()
	r.Seconds = time.Since(start).Seconds()
	r.EndBudget = budget.Stats().Capacity
	r.MeanBudget = capSum / r.Seconds
	if sizer != nil {
		r.Resizes = resizes.Load()
		r.Trace = trace
	}
	r.VerticesPS = float64(all) / r.Seconds
	r.GoodputPS = float64(good) / r.Seconds
	r.MaxWait = maxWait.Seconds()
	for _, s := range process {
		if s > o.Deadline.Seconds() {
			r.Late++
		}
	}
	r.MaxProcess = quantile(process, 1)
	r.P99Process = quantile(process, 0.99)
	r.InDeadline = r.MaxProcess <= o.Deadline.Seconds()
	return r
}

// The names of the sweep's auto-sized runs.
const (
	autoCalibrated = "auto (from the calibrated budget)"
	autoSmallest   = "auto (from the smallest budget)"
)

// Within reports whether the auto-sized run named name reached at least
// share (0.95 for "within 5 %") of the best fixed budget's goodput while
// staying inside the deadline.
func (s *SweepResult) Within(name string, share float64) (bool, error) {
	if s.BestFixed < 0 {
		return false, errors.New("demo: sweep: no fixed budget stayed inside the deadline")
	}
	for _, r := range s.Runs {
		if r.Name == name {
			return r.InDeadline && r.ShareOfBest >= share, nil
		}
	}
	return false, fmt.Errorf("demo: sweep: no run %q", name)
}

// WriteTable prints the sweep as a table.
func (s *SweepResult) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "%d messages, %s vertices (about 2/3 in heavy multipolygons of %s vertices); deadline %s; "+
		"calibrated %s vertices/s on %d cores, spread %.2f, drain share %.2f, deadline bound %s vertices; medians of %d rounds\n\n",
		s.Messages, Compact(float64(s.Vertices)), Compact(float64(s.Options.HeavyVertices)), s.Options.Deadline,
		Compact(s.RatePS), s.Machine.GOMAXPROCS, s.Spread, s.DrainShare, Compact(float64(s.DeadlineBnd)), s.Options.Rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "budget\tvertices\tvertices/s\tgoodput/s\tmax processing (worst)\tp99 processing\tlate\tof best (per round)\t")
	for i, r := range s.Runs {
		name := fmt.Sprintf("fixed, %g heavy", r.Factor)
		budget := Compact(float64(r.Budget))
		if r.Name != "fixed" {
			name = r.Name
			budget = fmt.Sprintf("%s -> %s (mean %s)", Compact(float64(r.Budget)), Compact(float64(r.EndBudget)), Compact(r.MeanBudget))
		}
		mark := ""
		if i == s.BestFixed {
			mark = " (best fixed)"
		}
		perRound := ""
		if len(r.RoundShare) > 1 {
			perRound = fmt.Sprintf(" (%.0f–%.0f %%)", 100*slices.Min(r.RoundShare), 100*slices.Max(r.RoundShare))
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%.2fs (%.2fs)\t%.2fs\t%d\t%.0f %%%s\t\n", name, mark, budget, Compact(r.VerticesPS),
			Compact(r.GoodputPS), r.MaxProcess, r.WorstProcess, r.P99Process, r.Late, 100*r.ShareOfBest, perRound)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, c := range []struct {
		name, start, bar string
		share            float64
	}{
		{autoCalibrated, "calibrated", "within 5 %", 0.95},
		{autoSmallest, "smallest", "at 90 % or more", 0.90},
	} {
		ok, err := s.Within(c.name, c.share)
		if err != nil {
			fmt.Fprintf(w, "%v\n", err)
			continue
		}
		verdict := "is"
		if !ok {
			verdict = "is NOT"
		}
		fmt.Fprintf(w, "The auto-sized budget from the %s start %s %s of the best fixed budget inside the deadline.\n", c.start, verdict, c.bar)
	}
	return nil
}
