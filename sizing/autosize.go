package sizing

import (
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
	Capacity() int64
	Resize(capacity int64) error
}

// AutoSizeConfig configures an [AutoSizer]. Budget, Estimator and OnResize
// are code; the other fields are settings, and their yaml and env tags are
// the keys of the router's budget.autosize section
// (budget.autosize.tail_share, SPILLWAY_BUDGET_AUTOSIZE_TAIL_SHARE).
type AutoSizeConfig struct {
	// Budget is the budget to resize. Required.
	Budget Resizable `yaml:"-" env:"-"`

	// Deadline is the broker's redelivery deadline (see
	// [Inputs.Deadline]). Required.
	Deadline time.Duration `yaml:"deadline" env:"DEADLINE"`
	// Headroom is the share of Deadline a full budget may take to drain.
	// 0 means [DefaultHeadroom].
	Headroom float64 `yaml:"headroom" env:"HEADROOM"`

	// MemoryBound is the memory bound in vertices, fixed: memory per vertex
	// does not drift the way time per vertex does, and measuring it needs
	// the collector off (see [MeasureBytesPerVertex] and [MemoryBound]).
	// 0 means no memory bound; then set Ceiling.
	MemoryBound int64 `yaml:"memory_bound" env:"MEMORY_BOUND"`

	// Floor and Ceiling limit every resize. Floor defaults to 1; Ceiling to
	// MemoryBound, or unlimited if that is 0 too.
	Floor   int64 `yaml:"floor" env:"FLOOR"`
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
	// first resize (default 3, at most Windows).
	MinWindows int `yaml:"min_windows" env:"MIN_WINDOWS"`
	// MinBusy is how long handlers must have been busy in a window for it
	// to count (default Window / 20): a nearly idle window measures
	// scheduling noise, not throughput.
	MinBusy time.Duration `yaml:"min_busy" env:"MIN_BUSY"`
	// Hysteresis is the relative change below which the budget is left
	// alone (default 0.1: a resize needs the target to differ from the
	// capacity by more than 10 %). Negative means 0.
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
	// window may take (default [DefaultTailShare]; negative turns the tail
	// guard off). The throughput alone sizes the budget for the average
	// message; when messages differ in cost per vertex, the slow ones take
	// several times the drain time while the budget is full. The guard
	// reads each window's slowest call as seconds per vertex of capacity
	// (its duration over the capacity when it began, or over its own
	// vertices if it was clamped to run alone) and caps the budget at
	// TailShare × Deadline over that: the tail bound. It shrinks the
	// budget readily, from the latest window alone and before MinWindows,
	// and holds it there until Windows windows have passed without a call
	// that slow: the bound is the lowest of the recent windows'. A slow
	// message that recurs every few windows keeps the budget down; one
	// that does not lets it grow back. It never goes below the vertices of
	// the call that set it, which runs alone at that size anyway.
	TailShare float64 `yaml:"tail_share" env:"TAIL_SHARE"`

	// Estimator gives each message's vertices when [AutoSizer.Middleware]
	// runs outside a budget middleware; inside one, the sizer reads the
	// charge the budget admitted the message with, and the message is
	// priced once. Default: cost.NewEstimator (cost.FullBudget). Only
	// messages priced from their header or counted (cost.SourceHeader,
	// cost.SourceComputed) are measured; a message of unknown cost would
	// teach the sizer a made-up rate, so it is passed through unmeasured.
	// Neither is a header count above the budget's capacity: it cannot be
	// told from a forged vertex_count.
	Estimator cost.ChargeEstimator `yaml:"-" env:"-"`

	// OnResize, if set, is called after each resize, from the goroutine of
	// the message whose completion triggered it, with the sizer's lock
	// held: it must be fast and must not call the sizer.
	OnResize func(from, to int64, b AutoBounds) `yaml:"-" env:"-"`
}

// AutoBounds is a snapshot of an [AutoSizer]'s view. The budget's capacity
// now is the Resizable's own Capacity().
type AutoBounds struct {
	// MemoryBound is the configured memory bound (0: none).
	MemoryBound int64 `json:"memory_bound"`
	// DeadlineBound is VerticesPerSecond × Deadline × Headroom; 0 until
	// MinWindows windows were measured.
	DeadlineBound int64 `json:"deadline_bound"`
	// TailBound is the tail guard's cap (see [AutoSizeConfig.TailShare]);
	// 0 until a window was measured or with the guard off.
	TailBound int64 `json:"tail_bound"`
	// Budget is the capacity the sizer wants: the smallest bound, clamped
	// to [Floor, Ceiling]. 0 until measured. The budget's capacity differs
	// from it by at most the hysteresis.
	Budget int64 `json:"budget"`
	// Binding names the smallest bound: "memory", "deadline" or "tail"
	// (the tail bound, not the throughput, set Budget); "" until measured.
	// When Budget differs from that bound, the floor or the ceiling held
	// it.
	Binding string `json:"binding"`
	// VerticesPerSecond is the median throughput of the recent windows:
	// vertices over core-busy time, so what Parallelism calls at once
	// would complete. 0 until a window was measured.
	VerticesPerSecond float64 `json:"vertices_per_second"`
	// Resizes counts the resizes done.
	Resizes uint64 `json:"resizes"`
	// Err is the last error the budget's Resize returned, if any.
	Err error `json:"-"`

	// For the tests: the limit that held Budget ("floor", "ceiling" or
	// ""), the number of windows the median was taken over, and the
	// longest handler call of the latest measured window.
	clamped     string
	windows     int
	slowestCall time.Duration
}

// AutoSizer keeps a vertex budget sized to the handler's measured speed.
//
// It times every handler call that runs through [AutoSizer.Middleware] (or
// is bracketed by [AutoSizer.Begin]) and counts the vertices completed. Time
// is cut into windows of Window; a window's throughput is the vertices
// completed in it divided by the time at least one handler was running in
// it (busy time), so idle gaps between messages do not read as a slow
// handler. The throughput is the median over the last Windows windows; from
// it the deadline bound is recomputed (throughput × Deadline × Headroom),
// the target is the smaller of that and the fixed memory bound, clamped to
// [Floor, Ceiling], and the budget is resized when the target differs from
// its capacity by more than Hysteresis.
//
// A tail guard caps that target too: each window's slowest call, as
// seconds per vertex of capacity, must fit in TailShare × Deadline (see
// [AutoSizeConfig.TailShare]). It shrinks the budget after one window and
// lets it grow back only after Windows windows without so slow a call.
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
// An AutoSizer is safe for concurrent use.
type AutoSizer struct {
	cfg AutoSizeConfig
	// capacity is the budget's capacity as last read or set under mu,
	// for Begin to note without taking the budget's lock per call.
	capacity atomic.Int64

	mu          sync.Mutex
	active      int
	busySince   time.Time
	winStart    time.Time
	winBusy     time.Duration // wall time with at least one call running
	winCoreBusy float64       // seconds of busy time × the share of Parallelism in use
	winVertices int64
	winDone     int
	winSlowest  time.Duration // the window's slowest call...
	winTail     float64       // ...its seconds per vertex of capacity...
	winTailV    int64         // ...and its vertices
	rates       []float64     // ring of the last cfg.Windows window rates
	tails       []int64       // ring of the windows' tail bounds, beside rates
	next        int           // where the next window goes in the rings
	bounds      AutoBounds
}

func (c *AutoSizeConfig) setDefaults() {
	if c.Headroom == 0 {
		c.Headroom = DefaultHeadroom
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
		c.TailShare = DefaultTailShare
	case c.TailShare < 0:
		c.TailShare = 0
	}
	if c.Estimator == nil {
		c.Estimator = cost.NewEstimator(cost.FullBudget)
	}
	if c.Parallelism == 0 {
		c.Parallelism = runtime.GOMAXPROCS(0)
	}
}

// Validate reports the first invalid field of c after defaults are applied,
// so zero fields are fine. The error is a [*spillway.FieldError] (matching
// [spillway.ErrInvalidConfig]) naming the field in snake case.
func (c AutoSizeConfig) Validate() error {
	bad := func(field string, v any, want string) error {
		return &spillway.FieldError{Field: field, Value: fmt.Sprint(v), Reason: want}
	}
	if c.Budget == nil {
		return bad("budget", "nil", "required")
	}
	c.setDefaults()
	switch {
	case c.Deadline <= 0:
		return bad("deadline", c.Deadline, "must be positive")
	case !positiveFinite(c.Headroom) || c.Headroom > 1:
		return bad("headroom", c.Headroom, "must be in (0, 1]")
	case c.MemoryBound < 0:
		return bad("memory_bound", c.MemoryBound, "must not be negative")
	case c.Floor < 1:
		return bad("floor", c.Floor, "must be positive")
	case c.Ceiling < c.Floor:
		return bad("ceiling", c.Ceiling, fmt.Sprintf("must not be below the floor (%d)", c.Floor))
	case c.Parallelism < 0:
		return bad("parallelism", c.Parallelism, "must be positive")
	case c.Window < 0:
		return bad("window", c.Window, "must be positive")
	case c.Windows < 1:
		return bad("windows", c.Windows, "must be positive")
	case c.MinWindows < 1:
		return bad("min_windows", c.MinWindows, "must be positive")
	case c.MinBusy < 0:
		return bad("min_busy", c.MinBusy, "must not be negative")
	case !(c.Hysteresis < 1):
		return bad("hysteresis", c.Hysteresis, "must be below 1")
	case math.IsNaN(c.TailShare) || c.TailShare > 1:
		return bad("tail_share", c.TailShare, "must be at most 1")
	}
	return nil
}

// NewAutoSizer validates cfg, fills in its defaults and returns a sizer. It
// does not resize the budget until MinWindows windows were measured. Errors
// are those of [AutoSizeConfig.Validate].
func NewAutoSizer(cfg AutoSizeConfig) (*AutoSizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	a := &AutoSizer{
		cfg:      cfg,
		rates:    make([]float64, 0, cfg.Windows),
		tails:    make([]int64, 0, cfg.Windows),
		winStart: time.Now(),
	}
	a.bounds.MemoryBound = cfg.MemoryBound
	a.capacity.Store(cfg.Budget.Capacity())
	return a, nil
}

// Middleware measures h. Put it inside the budget middleware (added after
// it), so only the handler's own work is timed, not the wait for budget:
//
//	router.AddMiddleware(budget.Middleware, sizer.Middleware)
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
		end := a.Begin()
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
// is used, so the message is priced once. Outside one the estimator prices
// it. Either way only counted costs are measured (a header or a computed count: a default
// charge would teach a made-up rate), and a header count above the
// capacity is not: the budget clamped it, so it cannot be told from a
// forged vertex_count, which would poison the throughput. A computed count
// above the capacity is the real size of a message that ran alone, and is
// measured at that size.
func (a *AutoSizer) sample(msg *message.Message) (int64, bool) {
	var c cost.Charge
	if admitted, ok := cost.AdmittedFromCtx(msg.Context()); ok {
		c = admitted
	} else {
		c = a.cfg.Estimator.Estimate(msg)
	}
	switch {
	case c.Source != cost.SourceHeader && c.Source != cost.SourceComputed:
		return 0, false
	case c.Source == cost.SourceHeader && c.Vertices > a.capacity.Load():
		return 0, false
	}
	return c.Vertices, true
}

// Begin marks the start of one handler call and returns the function that
// marks its end, to be called exactly once with the vertices the call
// completed (0 if it failed). Use it to measure work that does not run
// through a Watermill handler.
func (a *AutoSizer) Begin() (end func(vertices int64)) {
	capacity := a.capacity.Load()
	began := time.Now()
	a.mu.Lock()
	a.accrueLocked(began)
	a.active++
	a.mu.Unlock()
	var once sync.Once
	return func(vertices int64) {
		once.Do(func() { a.end(began, capacity, vertices) })
	}
}

func (a *AutoSizer) end(began time.Time, capacity, vertices int64) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.accrueLocked(now)
	a.active--
	vertices = max(vertices, 0)
	a.winVertices = addSaturating(a.winVertices, vertices)
	a.winDone++
	took := now.Sub(began)
	// A call larger than the capacity was clamped and ran alone: it held
	// its own size, not the capacity, so that is what its time scales with.
	if tail := took.Seconds() / float64(max(capacity, vertices, 1)); tail > a.winTail {
		a.winSlowest, a.winTail, a.winTailV = took, tail, vertices
	}
	if now.Sub(a.winStart) >= a.cfg.Window {
		a.closeWindowLocked(now)
	}
}

// accrueLocked adds the busy time since the last event to the window.
func (a *AutoSizer) accrueLocked(now time.Time) {
	if a.active > 0 {
		d := now.Sub(a.busySince)
		a.winBusy += d
		a.winCoreBusy += d.Seconds() * float64(min(a.active, a.cfg.Parallelism)) / float64(a.cfg.Parallelism)
	}
	a.busySince = now
}

// closeWindowLocked records the window's throughput, if it was busy enough
// to mean something, starts the next window and resizes if needed.
func (a *AutoSizer) closeWindowLocked(now time.Time) {
	measured := a.winDone > 0 && a.winBusy > 0 && a.winBusy >= a.cfg.MinBusy
	var latestTail int64
	if measured {
		rate := float64(a.winVertices) / a.winCoreBusy
		latestTail = math.MaxInt64
		if a.cfg.TailShare > 0 && a.winTail > 0 {
			latestTail = max(floorInt64(a.cfg.TailShare*a.cfg.Deadline.Seconds()/a.winTail), a.winTailV, 1)
		}
		if len(a.rates) < cap(a.rates) {
			a.rates, a.tails = append(a.rates, rate), append(a.tails, latestTail)
		} else {
			a.rates[a.next], a.tails[a.next] = rate, latestTail
		}
		a.next = (a.next + 1) % cap(a.rates)
		a.bounds.slowestCall = a.winSlowest
	}
	a.winStart, a.winBusy, a.winCoreBusy, a.winVertices, a.winDone = now, 0, 0, 0, 0
	a.winSlowest, a.winTail, a.winTailV = 0, 0, 0
	if measured {
		a.recomputeLocked(latestTail)
	}
}

// recomputeLocked recomputes the bounds after a measured window whose own
// tail bound is latestTail, and resizes if the target moved far enough.
func (a *AutoSizer) recomputeLocked(latestTail int64) {
	b := &a.bounds
	b.windows = len(a.rates)
	b.VerticesPerSecond = median(a.rates)
	cur := a.cfg.Budget.Capacity()
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
		b.DeadlineBound = DeadlineBound(b.VerticesPerSecond, a.cfg.Deadline, a.cfg.Headroom)
		target, binding = b.DeadlineBound, boundDeadline
		if tail < target {
			target, binding = tail, boundTail
		}
	}
	if a.cfg.MemoryBound > 0 && a.cfg.MemoryBound <= target {
		target, binding = a.cfg.MemoryBound, boundMemory
	}
	b.Binding, b.clamped = binding, ""
	switch {
	case target < a.cfg.Floor:
		target, b.clamped = a.cfg.Floor, "floor"
	case target > a.cfg.Ceiling:
		target, b.clamped = a.cfg.Ceiling, "ceiling"
	}
	b.Budget = target

	inRange := cur >= a.cfg.Floor && cur <= a.cfg.Ceiling
	if target == cur || inRange && math.Abs(float64(target-cur)) <= a.cfg.Hysteresis*float64(cur) {
		return
	}
	if err := a.cfg.Budget.Resize(target); err != nil {
		b.Err = err
		return
	}
	b.Err = nil
	a.capacity.Store(target)
	b.Resizes++
	if a.cfg.OnResize != nil {
		a.cfg.OnResize(cur, target, *b)
	}
}

// Bounds returns the current bounds, the budget wanted and which bound
// binds.
func (a *AutoSizer) Bounds() AutoBounds {
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
