package sizing

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
)

// Resizable is a budget whose capacity can change at run time.
// *middleware.VertexBudget implements it. Both methods must be safe for
// concurrent use.
type Resizable interface {
	// Capacity returns the budget's capacity in vertices.
	Capacity() int64
	// Resize sets the budget's capacity in vertices.
	Resize(capacity int64) error
}

// Config configures an [AutoSizer]. Its yaml and env tags are the keys of
// the router's budget.autosize section (budget.autosize.tail_share,
// SPILLWAY_BUDGET_AUTOSIZE_TAIL_SHARE).
type Config struct {
	// Deadline is the broker's redelivery deadline (see
	// [Inputs.Deadline]). Required.
	Deadline time.Duration `yaml:"deadline" env:"DEADLINE"`
	// Headroom is the share of Deadline a full budget may take to drain
	// (see [Inputs.Headroom]). 0 means 0.5.
	Headroom float64 `yaml:"headroom" env:"HEADROOM"`

	// MemoryBound is the memory bound in vertices, fixed: memory per vertex
	// does not drift the way time per vertex does, and measuring it needs
	// the collector off (see [MeasureBytesPerVertex] and [MemoryBound]).
	// 0 means no memory bound; then set Ceiling.
	MemoryBound int64 `yaml:"memory_bound" env:"MEMORY_BOUND"`

	// Floor is the smallest capacity a resize sets (default 1).
	Floor int64 `yaml:"floor" env:"FLOOR"`
	// Ceiling is the largest capacity a resize sets (default MemoryBound,
	// or unlimited if that is 0 too).
	Ceiling int64 `yaml:"ceiling" env:"CEILING"`

	// Window is the length of one measuring window. Default: Deadline.
	// Keep it several times longer than one handler call and at least as
	// long as a full budget takes to drain (Deadline × Headroom), so the
	// work in flight at a window's edge is small next to what the window
	// completes.
	Window time.Duration `yaml:"window" env:"WINDOW"`
	// Windows is how many recent windows the throughput is the median of
	// (default 5). After the mix changes, the budget follows once more than
	// half of them were measured on the new mix.
	Windows int `yaml:"windows" env:"WINDOWS"`
	// MinWindows is how many windows must have been measured before the
	// throughput sets the budget (default 3, at most Windows). Until then
	// the tail guard may shrink it, and it grows only while it is too
	// small to keep the cores busy (see [AutoSizer]). It is also how many
	// windows at a grown capacity judge whether the growth paid.
	MinWindows int `yaml:"min_windows" env:"MIN_WINDOWS"`
	// MinBusy is how long handlers must have been busy in a window for it
	// to count (default Window / 20): a nearly idle window measures
	// scheduling noise, not throughput.
	MinBusy time.Duration `yaml:"min_busy" env:"MIN_BUSY"`
	// Hysteresis is the relative change below which the budget is left
	// alone (default 0.1: a resize needs the target to differ from the
	// capacity by more than 10 %). It is also how much a full budget's
	// growth must raise the throughput to count (see [AutoSizer]).
	// Negative means 0.
	Hysteresis float64 `yaml:"hysteresis" env:"HYSTERESIS"`

	// Parallelism is how many handler calls the process can run at full
	// speed at once: its cores for CPU-bound work (default GOMAXPROCS when
	// the sizer is made). While fewer calls than that run, a window's busy
	// time counts only the share of the cores in use (see [AutoSizer]), so
	// a budget too small to keep every core busy still measures what a
	// full one would do and can grow out of it. Set it to 1 for work that
	// does not speed up with concurrency, or to the cores the consumers
	// of this budget really get when they share the process with other
	// heavy work.
	Parallelism int `yaml:"parallelism" env:"PARALLELISM"`

	// TailShare is the share of Deadline the slowest handler call of a
	// window may take (default 0.75; negative turns the tail guard off).
	// The throughput alone sizes the budget for the average message;
	// when messages differ in cost per vertex, the slow ones take several
	// times the drain time while the budget is full. The guard
	// reads each window's slowest call as seconds per vertex of capacity
	// (its duration, counted per core as busy time is, over the larger
	// capacity of its start and end, or over its own vertices if it was
	// clamped to run alone) and caps the budget at
	// TailShare × Deadline over that: the tail bound. It shrinks the
	// budget readily, from the latest window alone and before MinWindows,
	// and holds it there until Windows windows have passed without a call
	// that slow: the bound is the lowest of the recent windows'. A slow
	// message that recurs every few windows keeps the budget down; one
	// that does not lets it grow back. It never goes below the vertices of
	// the call that set it, which runs alone at that size anyway.
	TailShare float64 `yaml:"tail_share" env:"TAIL_SHARE"`
}

// AutoSizer keeps a vertex budget sized to the handler's measured speed.
//
// It times every handler call that runs through [AutoSizer.Middleware] and
// counts the vertices completed. Time is cut into windows of Window; a
// window's throughput is the vertices completed in it divided by the time
// at least one handler was running in it (busy time), so idle gaps between
// messages do not read as a slow handler. The throughput is the median over
// the last Windows windows; from it the deadline bound is recomputed
// (throughput × Deadline × Headroom), the target is the smaller of that and
// the fixed memory bound, clamped to [Floor, Ceiling], and the budget is
// resized when the target differs from its capacity by more than
// Hysteresis.
//
// A tail guard caps that target too: each window's slowest call, as
// seconds per vertex of capacity, must fit in TailShare × Deadline (see
// [Config.TailShare]). It shrinks the budget after one window and
// lets it grow back only after Windows windows without so slow a call.
//
// The throughput also caps the target where growing stopped paying: when
// a full budget grows and the next MinWindows windows complete no more
// vertices per wall-clock busy second than the windows before it (by more
// than Hysteresis), the budget goes back to where it was and stays there for
// Windows windows ("throughput" binds): past the point where the
// throughput stops rising, a larger budget only makes messages wait
// longer inside the process (see kneeLocked).
//
// Windows advance lazily, when a handler call completes after the current
// window's end; no goroutine runs and nothing needs closing. With no
// traffic, the budget stays as it is.
//
// Busy time is counted per core: a stretch with k of Parallelism calls
// running counts k/Parallelism of its length (all of it once k reaches
// Parallelism). So while the budget is too small to keep every core busy
// (a heavy message clamped to run alone, say), the measured throughput is
// still what the whole process would do, and the budget can grow past the
// size that starves the other cores. That extrapolation assumes the work
// scales with the cores; where it does not, set Parallelism lower. The tail
// guard catches an overestimate that makes calls slow.
//
// Before MinWindows windows were measured the budget grows only while it
// starves the cores: when, over MinBusy of busy time, fewer than
// Parallelism calls ran for most of it while the calls running held at
// least half of the budget (so the next message did not fit). It then
// grows at once to what would have kept every core busy, at least double,
// but never past the deadline bound of the throughput measured so far,
// the tail bound, the memory bound or the ceiling. A message larger than
// the budget, which the budget clamps to run alone, grows it as it starts
// (to room for Parallelism such messages), since it starves the cores for
// as long as it runs. A budget started too
// small thus fills the cores within the first window instead of idling
// them for MinWindows windows. A lone producer of messages half the
// budget's size or larger looks the same and grows it the same way, to
// little harm: not past the deadline bound measured so far, where the
// windows would take it anyway.
//
// An AutoSizer is safe for concurrent use.
type AutoSizer struct {
	cfg      Config
	budget   Resizable
	onResize func(from, to int64, b Bounds) // nil: none
	// estimator prices a message that comes without an admitted charge
	// (the sizer runs outside a budget middleware).
	estimator cost.ChargeEstimator
	// capacity is the budget's capacity as last read or set under mu,
	// for begin to note without taking the budget's lock per call.
	capacity atomic.Int64

	mu          sync.Mutex
	active      int
	inflight    int64 // the vertices of the measured calls running
	busySince   time.Time
	coreClock   float64 // core-busy seconds since New, as winCoreBusy but never reset
	allVertices int64   // vertices completed since New
	winStart    time.Time
	winBusy     time.Duration // wall time with at least one call running
	winCoreBusy float64       // seconds of busy time × the share of Parallelism in use
	winVertices int64
	winDone     int
	winTail     float64   // the window's slowest call: its seconds per vertex of capacity...
	winTailV    int64     // ...and its vertices
	rates       []float64 // ring of the last cfg.Windows window rates
	tails       []int64   // ring of the windows' tail bounds, beside rates
	walls       []float64 // ring of the windows' vertices per wall-clock busy second, beside rates
	wallCaps    []int64   // ring of the capacity each window ran at throughout (0: it changed), beside rates
	next        int       // where the next window goes in the rings
	bounds      Bounds

	// The knee (see kneeLocked): the window's busy time during which the
	// calls running held at least half of the budget, and during which
	// that starved the cores; whether the capacity changed in it.
	winFull    time.Duration
	winStarved time.Duration
	winResized bool
	// probeFrom is the capacity a full budget last grew from (0: none
	// pending), and probeRate its throughput there; once probeWindows
	// reaches MinWindows, the windows at the new capacity judge whether
	// the growth paid.
	probeFrom    int64
	probeRate    float64
	probeWindows int
	// knee is the capacity past which growth did not raise the
	// throughput (0: none known); it holds for kneeLeft more windows.
	knee     int64
	kneeLeft int

	// The start-up ramp (see rampLocked): since its last decision, the
	// busy time, the part of it the budget starved the cores, and the
	// capacity that would have kept them all busy.
	rampBusy    time.Duration
	rampStarved time.Duration
	rampNeed    int64
}

func (c *Config) setDefaults() {
	if c.Headroom == 0 {
		c.Headroom = defaultHeadroom
	}
	if c.Floor == 0 {
		c.Floor = 1
	}
	if c.Ceiling == 0 {
		c.Ceiling = c.MemoryBound
		if c.Ceiling == 0 {
			c.Ceiling = math.MaxInt64
		}
	}
	if c.Window == 0 {
		c.Window = c.Deadline
	}
	if c.Windows == 0 {
		c.Windows = 5
	}
	if c.MinWindows == 0 {
		c.MinWindows = 3
	}
	c.MinWindows = min(c.MinWindows, c.Windows)
	if c.MinBusy == 0 {
		c.MinBusy = c.Window / 20
	}
	switch {
	case c.Hysteresis == 0:
		c.Hysteresis = 0.1
	case c.Hysteresis < 0:
		c.Hysteresis = 0
	}
	switch {
	case c.TailShare == 0:
		c.TailShare = defaultTailShare
	case c.TailShare < 0:
		c.TailShare = 0
	}
	if c.Parallelism == 0 {
		c.Parallelism = runtime.GOMAXPROCS(0)
	}
}

// Validate reports every invalid field of c after defaults are applied, so
// zero fields are fine. Each error is a [*spillway.FieldError] (matching
// [spillway.ErrInvalidConfig]) naming the field in snake case; they are
// joined.
func (c Config) Validate() error {
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, &spillway.FieldError{Field: field, Value: fmt.Sprint(v), Reason: want})
	}
	c.setDefaults()
	if c.Deadline <= 0 {
		bad("deadline", c.Deadline, "must be positive")
	}
	if !positiveFinite(c.Headroom) || c.Headroom > 1 {
		bad("headroom", c.Headroom, "must be in (0, 1]")
	}
	if c.MemoryBound < 0 {
		bad("memory_bound", c.MemoryBound, "must not be negative")
	}
	if c.Floor < 1 {
		bad("floor", c.Floor, "must be positive")
	} else if c.Ceiling < c.Floor {
		bad("ceiling", c.Ceiling, fmt.Sprintf("must not be below the floor (%d)", c.Floor))
	}
	if c.Parallelism < 0 {
		bad("parallelism", c.Parallelism, "must be positive")
	}
	if c.Window < 0 {
		bad("window", c.Window, "must be positive")
	}
	if c.Windows < 1 {
		bad("windows", c.Windows, "must be positive")
	}
	if c.MinWindows < 1 {
		bad("min_windows", c.MinWindows, "must be positive")
	}
	if c.MinBusy < 0 {
		bad("min_busy", c.MinBusy, "must not be negative")
	}
	if !(c.Hysteresis < 1) {
		bad("hysteresis", c.Hysteresis, "must be below 1")
	}
	if math.IsNaN(c.TailShare) || c.TailShare > 1 {
		bad("tail_share", c.TailShare, "must be at most 1")
	}
	return errors.Join(errs...)
}

// WithOnResize has f called after each resize the [AutoSizer] makes, with
// the capacity before and after and the bounds that led to it, from the
// goroutine of the message whose completion triggered it, with the
// sizer's lock held: f must be fast and must not call the sizer.
func WithOnResize(f func(from, to int64, b Bounds)) Option {
	return func(o *options) { o.onResize = f }
}

// New validates cfg, fills in its defaults and returns a sizer that
// resizes budget (*middleware.VertexBudget implements [Resizable]). Until
// MinWindows windows were measured it only shrinks the budget for the tail
// guard and grows it while it starves the cores (see [AutoSizer]).
// Errors are those of [Config.Validate], and one for a nil budget.
func New(budget Resizable, cfg Config, opts ...Option) (*AutoSizer, error) {
	if budget == nil {
		return nil, errors.New("sizing: New: nil budget: pass the budget to resize (a *middleware.VertexBudget)")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	a := &AutoSizer{
		cfg:       cfg,
		budget:    budget,
		onResize:  o.onResize,
		estimator: cost.NewEstimator(cost.FullBudget),
		rates:     make([]float64, 0, cfg.Windows),
		tails:     make([]int64, 0, cfg.Windows),
		walls:     make([]float64, 0, cfg.Windows),
		wallCaps:  make([]int64, 0, cfg.Windows),
		winStart:  time.Now(),
	}
	a.bounds.MemoryBound = cfg.MemoryBound
	a.capacity.Store(budget.Capacity())
	return a, nil
}

// Middleware measures h. Put it inside the budget middleware (added after
// it), so only the handler's own work is timed, not the wait for budget:
//
//	router.AddMiddleware(budget.Middleware, sizer.Middleware)
//
// A call is measured at the charge the budget admitted the message with
// ([cost.AdmittedFromCtx]) or, outside a budget, at the message's
// vertex_count. A message of unknown cost would teach the sizer a made-up
// rate, and a vertex_count above the budget's capacity cannot be told from
// a forged one: such calls run unmeasured.
//
// A handler call that returns an error or panics counts as busy time but
// completes no vertices, so failing work lowers the measured throughput:
// the budget errs small.
func (a *AutoSizer) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		vertices, measure := a.sample(msg)
		if !measure {
			return h(msg)
		}
		end := a.begin(vertices)
		var ok bool
		defer func() {
			if ok {
				end(vertices)
			} else {
				end(0)
			}
		}()
		msgs, err := h(msg)
		ok = err == nil
		return msgs, err
	}
}

// sample returns the vertices msg's handler call is measured with, and
// false when the call is not to be measured at all.
//
// Inside a budget middleware the charge it admitted the message with,
// which it passes down in the message's context ([cost.AdmittedFromCtx]),
// is used, so the message is priced once. Outside one its vertex_count
// prices it. Either way only counted costs are measured (a header or a
// computed count: a default charge would teach a made-up rate), and a
// header count above the
// capacity is not: the budget clamped it, so it cannot be told from a
// forged vertex_count, which would poison the throughput. A computed count
// above the capacity is the real size of a message that ran alone, and is
// measured at that size.
func (a *AutoSizer) sample(msg *message.Message) (int64, bool) {
	var c cost.Charge
	if admitted, ok := cost.AdmittedFromCtx(msg.Context()); ok {
		c = admitted
	} else {
		c = a.estimator.Estimate(msg)
	}
	switch {
	case c.Source != cost.SourceHeader && c.Source != cost.SourceComputed:
		return 0, false
	case c.Source == cost.SourceHeader && c.Vertices > a.capacity.Load():
		return 0, false
	}
	return c.Vertices, true
}

// begin marks the start of one handler call that holds charged vertices of
// the budget and returns the function that marks its end, to be called
// with the vertices the call completed (0 if it failed); calls after the
// first are ignored.
func (a *AutoSizer) begin(charged int64) (end func(vertices int64)) {
	charged = max(charged, 0)
	capacity := a.capacity.Load()
	a.mu.Lock()
	a.accrueLocked(time.Now())
	// A message larger than the budget was clamped and runs alone: the
	// budget starves the cores for as long as it runs, so the ramp need
	// not wait for it to complete.
	alone := a.active == 0 && charged > capacity
	a.active++
	a.inflight = addSaturating(a.inflight, charged)
	coreAtStart := a.coreClock
	if alone && len(a.rates) < a.cfg.MinWindows {
		need := int64(math.MaxInt64)
		if charged <= math.MaxInt64/int64(a.cfg.Parallelism) {
			need = charged * int64(a.cfg.Parallelism)
		}
		a.growLocked(need)
	}
	a.mu.Unlock()
	var once sync.Once
	return func(vertices int64) {
		once.Do(func() { a.end(coreAtStart, capacity, charged, vertices) })
	}
}

func (a *AutoSizer) end(coreAtStart float64, capacity, charged, vertices int64) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.accrueLocked(now)
	a.active--
	a.inflight = max(a.inflight-charged, 0)
	vertices = max(vertices, 0)
	a.winVertices = addSaturating(a.winVertices, vertices)
	a.allVertices = addSaturating(a.allVertices, vertices)
	a.winDone++
	// The call's time counts per core, as busy time does: a call that ran
	// while cores were idle (the budget too small for more) would take
	// its share of a full budget's drain, not its time alone. It is read
	// against the larger capacity of its start and its end: a budget that
	// grew while it ran admitted more to share the cores with. A call
	// larger than the capacity was clamped and ran alone: it held its own
	// size, not the capacity, so that is what its time scales with.
	coreSeconds := a.coreClock - coreAtStart
	capacity = max(capacity, a.capacity.Load())
	if tail := coreSeconds / float64(max(capacity, vertices, 1)); tail > a.winTail {
		a.winTail, a.winTailV = tail, vertices
	}
	if now.Sub(a.winStart) >= a.cfg.Window {
		a.closeWindowLocked(now)
	}
	if len(a.rates) < a.cfg.MinWindows {
		a.rampLocked()
	}
}

// accrueLocked adds the busy time since the last event to the window and
// to the ramp.
func (a *AutoSizer) accrueLocked(now time.Time) {
	if a.active > 0 {
		d := now.Sub(a.busySince)
		core := d.Seconds() * float64(min(a.active, a.cfg.Parallelism)) / float64(a.cfg.Parallelism)
		a.winBusy += d
		a.winCoreBusy += core
		a.coreClock += core
		a.rampBusy += d
		// The budget starves the cores when some are idle while the
		// calls running hold at least half of it: the next message
		// (unless it is larger than they are) did not fit.
		if full := a.inflight >= a.capacity.Load()/2; full {
			a.winFull += d
			if a.active < a.cfg.Parallelism {
				a.rampStarved += d
				a.winStarved += d
				need := float64(a.inflight) * float64(a.cfg.Parallelism) / float64(a.active)
				a.rampNeed = max(a.rampNeed, floorInt64(math.Ceil(need)))
			}
		}
	}
	a.busySince = now
}

// rampLocked grows the budget before the throughput is known (fewer than
// MinWindows windows measured) while it is too small to keep the cores
// busy. Waiting MinWindows windows at a budget that starves the cores
// costs throughput for as long, so once handlers were busy for MinBusy,
// most of it with idle cores and the calls running holding the budget, the
// budget grows at once: to what would have kept every core busy, at least
// double. It never grows past what is known: the deadline bound of the
// throughput measured so far (vertices over core-busy time since New,
// which the work still in flight only lowers), the tail bound, the memory
// bound and the ceiling. Once the cores are busy it stops, and the
// measured windows take over. A call larger than the capacity (clamped by
// the budget, so it runs alone) starves the cores for as long as it runs:
// begin grows the budget as it starts, to room for Parallelism such calls,
// within the same limits.
func (a *AutoSizer) rampLocked() {
	if a.rampBusy < max(a.cfg.MinBusy, 1) {
		return
	}
	starved := 2*a.rampStarved >= a.rampBusy
	need := a.rampNeed
	a.rampBusy, a.rampStarved, a.rampNeed = 0, 0, 0
	if starved {
		a.growLocked(need)
	}
}

// growLocked grows the budget for the ramp: to need, at least double,
// never past the deadline bound of the throughput measured so far, the
// tail bound, the memory bound or the ceiling (see rampLocked). With
// nothing measured yet it does nothing.
func (a *AutoSizer) growLocked(need int64) {
	if a.allVertices == 0 || a.coreClock <= 0 {
		return
	}
	cur := a.budget.Capacity()
	a.capacity.Store(cur)
	target := max(addSaturating(cur, cur), need)
	binding := ""
	deadline := deadlineBound(float64(a.allVertices)/a.coreClock, a.cfg.Deadline, a.cfg.Headroom)
	if deadline < target {
		target, binding = deadline, boundDeadline
	}
	if tail := a.tailBoundLocked(); tail < target {
		target, binding = tail, boundTail
	}
	if a.cfg.MemoryBound > 0 && a.cfg.MemoryBound <= target {
		target, binding = a.cfg.MemoryBound, boundMemory
	}
	target = min(target, a.cfg.Ceiling)
	if float64(target) <= float64(cur)*(1+a.cfg.Hysteresis) {
		return
	}
	// Noted before the resize, so the calls it lets in note it too.
	a.capacity.Store(target)
	if err := a.budget.Resize(target); err != nil {
		a.capacity.Store(cur) // the budget refused: the next stretch tries again
		return
	}
	a.winResized = true
	b := &a.bounds
	b.Budget, b.Binding = target, binding
	if binding == boundDeadline {
		b.DeadlineBound = deadline
	}
	if a.onResize != nil {
		a.onResize(cur, target, *b)
	}
}

// tailBoundLocked returns the tail bound of the recent windows and of the
// one under way (math.MaxInt64 with the guard off or nothing measured).
func (a *AutoSizer) tailBoundLocked() int64 {
	tail := int64(math.MaxInt64)
	if a.cfg.TailShare <= 0 {
		return tail
	}
	if len(a.tails) > 0 {
		tail = slices.Min(a.tails)
	}
	if a.winTail > 0 {
		tail = min(tail, a.windowTailLocked())
	}
	return tail
}

// windowTailLocked returns the tail bound of the window under way: its
// slowest call must fit in TailShare × Deadline; never below that call's
// own vertices.
func (a *AutoSizer) windowTailLocked() int64 {
	return max(floorInt64(a.cfg.TailShare*a.cfg.Deadline.Seconds()/a.winTail), a.winTailV, 1)
}

// closeWindowLocked records the window's throughput, if it was busy enough
// to mean something, starts the next window and resizes if needed.
func (a *AutoSizer) closeWindowLocked(now time.Time) {
	measured := a.winDone > 0 && a.winBusy > 0 && a.winBusy >= a.cfg.MinBusy
	var w window
	if measured {
		rate := float64(a.winVertices) / a.winCoreBusy
		w = window{
			tail:    math.MaxInt64,
			wall:    float64(a.winVertices) / a.winBusy.Seconds(),
			full:    2*a.winFull >= a.winBusy,
			starved: 2*a.winStarved >= a.winBusy,
		}
		if a.cfg.TailShare > 0 && a.winTail > 0 {
			w.tail = a.windowTailLocked()
		}
		if !a.winResized {
			w.capacity = a.capacity.Load()
		}
		if len(a.rates) < cap(a.rates) {
			a.rates, a.tails = append(a.rates, rate), append(a.tails, w.tail)
			a.walls, a.wallCaps = append(a.walls, w.wall), append(a.wallCaps, w.capacity)
		} else {
			a.rates[a.next], a.tails[a.next] = rate, w.tail
			a.walls[a.next], a.wallCaps[a.next] = w.wall, w.capacity
		}
		a.next = (a.next + 1) % cap(a.rates)
	}
	a.winStart, a.winBusy, a.winCoreBusy, a.winVertices, a.winDone = now, 0, 0, 0, 0
	a.winTail, a.winTailV = 0, 0
	a.winFull, a.winStarved, a.winResized = 0, 0, false
	if measured {
		a.recomputeLocked(w)
	}
}

// window is what recomputeLocked reads of the window just measured.
type window struct {
	tail     int64   // its tail bound
	wall     float64 // vertices per wall-clock busy second
	capacity int64   // the capacity it ran at throughout; 0 if that changed
	full     bool    // the calls running held at least half the budget for most of its busy time...
	starved  bool    // ...and fewer than Parallelism of them ran
}

// recomputeLocked recomputes the bounds after the measured window w, and
// resizes if the target moved far enough.
func (a *AutoSizer) recomputeLocked(w window) {
	b := &a.bounds
	b.VerticesPerSecond = median(a.rates)
	cur := a.budget.Capacity()
	a.capacity.Store(cur)

	// The tail bound: the lowest of the recent windows' (the latest is
	// among them). Shrinking needs one window; growing needs all of them.
	tail := int64(math.MaxInt64)
	if a.cfg.TailShare > 0 {
		tail = slices.Min(a.tails)
		b.TailBound = tail
		if tail == math.MaxInt64 {
			b.TailBound = 0
		}
	}
	var target int64
	var binding string
	if len(a.rates) < a.cfg.MinWindows {
		// Too early to trust the throughput: only the tail guard may act,
		// and only to shrink.
		if tail >= cur {
			return
		}
		target, binding = tail, boundTail
	} else {
		b.DeadlineBound = deadlineBound(b.VerticesPerSecond, a.cfg.Deadline, a.cfg.Headroom)
		target, binding = b.DeadlineBound, boundDeadline
		if tail < target {
			target, binding = tail, boundTail
		}
	}
	if a.cfg.MemoryBound > 0 && a.cfg.MemoryBound <= target {
		target, binding = a.cfg.MemoryBound, boundMemory
	}
	if len(a.rates) >= a.cfg.MinWindows {
		if knee := a.kneeLocked(w, cur); knee < target {
			target, binding = knee, boundThroughput
		}
		if a.probeFrom > 0 {
			// A growth under judgement: no more until it is judged.
			target = min(target, cur)
		}
	}
	b.Binding = binding
	b.Budget = min(max(target, a.cfg.Floor), a.cfg.Ceiling)
	target = b.Budget
	probing := target > cur && w.full && w.capacity == cur && a.knee == 0
	if probing {
		// A full budget grows: the windows at the new capacity tell
		// whether that raised the throughput (see kneeLocked).
		a.probeFrom, a.probeRate, a.probeWindows = cur, a.wallAtLocked(cur), 0
	}

	inRange := cur >= a.cfg.Floor && cur <= a.cfg.Ceiling
	if target == cur || inRange && math.Abs(float64(target-cur)) <= a.cfg.Hysteresis*float64(cur) {
		if probing {
			a.probeFrom = 0 // no growth to judge
		}
		return
	}
	a.capacity.Store(target) // before the resize, as in rampLocked
	if err := a.budget.Resize(target); err != nil {
		// The budget refused: its capacity stays, and the next measured
		// window tries again.
		a.capacity.Store(cur)
		if probing {
			a.probeFrom = 0
		}
		return
	}
	if a.onResize != nil {
		a.onResize(cur, target, *b)
	}
}

// kneeLocked returns the knee: the capacity past which the budget's last
// growth did not raise the throughput (math.MaxInt64 if none is known),
// after judging the growth the window w ran at.
//
// Once the cores are busy, a budget that grows without raising the
// throughput only adds waiting inside the process: by Little's law the
// vertices in flight are the throughput times the time each spends
// inside, so with the throughput flat, every vertex added to the budget
// adds to every message's processing time. So when a full budget grows
// (the calls running held at least half of it for most of a window), the
// next MinWindows windows, run at the new capacity throughout and with no
// further growth, judge it by their median vertices per wall-clock busy
// second (not per core: a budget that starved the cores completes fewer
// per second, and growing out of that pays). Unless that rose by more
// than Hysteresis over the windows run at the old capacity, the old
// capacity is the knee: the budget goes back to
// it and grows past it again only after Windows windows, or as soon as a
// window finds it starving the cores. The deadline, tail and memory
// bounds stay upper limits, so the budget still shrinks when the handler
// slows.
func (a *AutoSizer) kneeLocked(w window, cur int64) int64 {
	if a.knee > 0 {
		a.kneeLeft--
		if w.starved || a.kneeLeft <= 0 {
			a.knee = 0
		}
	}
	if a.probeFrom > 0 {
		if w.capacity != cur || cur <= a.probeFrom {
			a.probeFrom = 0 // the capacity moved on: nothing to judge
		} else if a.probeWindows++; a.probeWindows >= a.cfg.MinWindows {
			if a.wallAtLocked(cur) <= a.probeRate*(1+a.cfg.Hysteresis) {
				a.knee, a.kneeLeft = a.probeFrom, a.cfg.Windows
			} else {
				a.knee = 0
			}
			a.probeFrom = 0
		}
	}
	if a.knee == 0 {
		return math.MaxInt64
	}
	return a.knee
}

// wallAtLocked returns the median throughput per wall-clock busy second
// of the recent windows run at capacity throughout.
func (a *AutoSizer) wallAtLocked(capacity int64) float64 {
	var at []float64
	for i, c := range a.wallCaps {
		if c == capacity {
			at = append(at, a.walls[i])
		}
	}
	return median(at)
}

// Bounds returns the current bounds, the budget wanted and which bound
// binds.
func (a *AutoSizer) Bounds() Bounds {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bounds
}

// addSaturating returns a + b for non-negative a and b, or math.MaxInt64
// where the sum would overflow.
func addSaturating(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}
