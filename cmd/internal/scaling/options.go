package scaling

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spillway-go/spillway/internal/refwork"
)

// The brokers a sweep can run on.
const (
	BrokerKafka = "kafka"
	BrokerRedis = "redis"
)

// The message costs a sweep can run.
const (
	CostPing    = "ping"    // a GeoJSON point: one vertex
	CostPolygon = "polygon" // a real county polygon (GeoJSON): tens of vertices
	CostHeavy   = "heavy"   // real polygons assembled into one WKB multipolygon
)

// The consumers compared in each cell.
const (
	ConsumerBare     = "bare"     // watermill-kafka / watermill-redisstream under Watermill's router
	ConsumerSpillway = "spillway" // the Spillway router on the same broker
)

var (
	knownBrokers = []string{BrokerKafka, BrokerRedis}
	knownCosts   = []string{CostPing, CostPolygon, CostHeavy}
)

// Options shape a sweep. Every combination of Brokers, Parallelism,
// Handlers and Costs is a cell; in each cell the bare subscriber runs once
// and the Spillway router once per budget in Budgets, Runs times.
type Options struct {
	Brokers     []string // kafka, redis
	Parallelism []int    // partitions per topic (Kafka), consumers per topic (Redis)
	Handlers    []int    // handlers, each on a topic of its own
	Costs       []string // ping, polygon, heavy
	Budgets     []int64  // Spillway's vertex budget (budget.vertices)

	// Messages is the number of pings in a cell's backlog, split evenly
	// over its handlers; a polygon cell has half as many messages and a
	// heavy cell a hundredth (at least one per handler).
	Messages int
	// HeavyVertices is the least number of vertices of a heavy message.
	HeavyVertices int
	// Work is the handler's work after decoding: a name of
	// internal/refwork (area-centroid by default).
	Work string
	// Runs repeats each cell's consumers, alternating their order; the
	// table shows the median of each figure.
	Runs int
	// Tolerance is how much the CPU-per-message ratio may rise, as a
	// share of its value at the smallest setting, before the check calls
	// it growth. The machine is shared and one run is noisy.
	Tolerance float64
	// StartTimeout bounds how long a consumer may take to hold its first
	// message on every handler; RunTimeout how long it may take to consume
	// the backlog.
	StartTimeout time.Duration
	RunTimeout   time.Duration

	// Progress, if set, receives a line per phase.
	Progress func(string) `json:"-"`
}

// DefaultOptions is the full sweep.
func DefaultOptions() Options {
	return Options{
		Brokers:       []string{BrokerKafka, BrokerRedis},
		Parallelism:   []int{1, 4, 12, 48},
		Handlers:      []int{1, 8},
		Costs:         []string{CostPing, CostPolygon, CostHeavy},
		Budgets:       []int64{200_000, 20_000_000},
		Messages:      20_000,
		HeavyVertices: 10_000,
		Work:          "area-centroid",
		Runs:          3,
		Tolerance:     0.25,
		StartTimeout:  2 * time.Minute,
		RunTimeout:    10 * time.Minute,
	}
}

// QuickOptions is a short sweep (a couple of minutes): two parallelisms,
// pings and heavy messages, one budget, a smaller backlog, one run.
func QuickOptions() Options {
	o := DefaultOptions()
	o.Parallelism = []int{1, 12}
	o.Costs = []string{CostPing, CostHeavy}
	o.Budgets = o.Budgets[:1]
	o.Messages = 6_000
	o.Runs = 1
	return o
}

// ErrInvalid is wrapped by every error about unusable options.
var ErrInvalid = errors.New("scaling: invalid options")

// Validate reports the first unusable field, wrapping [ErrInvalid].
func (o Options) Validate() error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

func (o Options) validate() error {
	switch {
	case len(o.Brokers) == 0 || len(o.Parallelism) == 0 || len(o.Handlers) == 0 || len(o.Costs) == 0 || len(o.Budgets) == 0:
		return errors.New("brokers, parallelism, handlers, costs and budgets each need at least one value")
	case o.Messages < 1:
		return fmt.Errorf("messages must be positive, got %d", o.Messages)
	case o.HeavyVertices < 1:
		return fmt.Errorf("heavy vertices must be positive, got %d", o.HeavyVertices)
	case o.Runs < 1:
		return fmt.Errorf("runs must be at least 1, got %d", o.Runs)
	case o.Tolerance < 0:
		return fmt.Errorf("tolerance must not be negative, got %v", o.Tolerance)
	case o.StartTimeout <= 0 || o.RunTimeout <= 0:
		return errors.New("timeouts must be positive")
	}
	if _, err := refwork.ByName(o.Work); err != nil {
		return err
	}
	for _, b := range o.Brokers {
		if !slices.Contains(knownBrokers, b) {
			return fmt.Errorf("unknown broker %q (have %v)", b, knownBrokers)
		}
	}
	for _, c := range o.Costs {
		if !slices.Contains(knownCosts, c) {
			return fmt.Errorf("unknown message cost %q (have %v)", c, knownCosts)
		}
	}
	for _, p := range o.Parallelism {
		if p < 1 || p > 256 {
			return fmt.Errorf("parallelism must be 1 to 256, got %d", p)
		}
	}
	for _, h := range o.Handlers {
		if h < 1 || h > 64 {
			return fmt.Errorf("handlers must be 1 to 64, got %d", h)
		}
	}
	for _, b := range o.Budgets {
		if b < 1 {
			return fmt.Errorf("budgets must be positive, got %d", b)
		}
	}
	return nil
}

// messages is the backlog of a cell of cost c with h handlers: per
// handler, at least one.
func (o Options) messages(c string, h int) int {
	n := o.Messages
	switch c {
	case CostPolygon:
		n /= 2
	case CostHeavy:
		n /= 100
	}
	return max(n/h, 1) * h
}

func (o *Options) progress(format string, args ...any) {
	if o.Progress != nil {
		o.Progress(fmt.Sprintf(format, args...))
	}
}
