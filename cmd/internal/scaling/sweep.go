package scaling

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/spillway-go/spillway/cmd/internal/kafkaproc"
	"github.com/spillway-go/spillway/internal/refwork"
)

// Report is a sweep's outcome.
type Report struct {
	// Version is the layout of the JSON, bumped on incompatible changes.
	Version int     `json:"version"`
	Machine Machine `json:"machine"`
	// Started and Took date the sweep and give its length.
	Started time.Time `json:"started"`
	Took    string    `json:"took"`
	Options Options   `json:"options"`
	// Skipped lists what could not run, and why (a missing redis-server).
	Skipped []string `json:"skipped,omitempty"`
	Results []Result `json:"results"`
	// Checks compare Spillway's CPU-per-message ratio along each axis.
	Checks []Check `json:"checks"`
	// Pass is true when no check found the ratio growing; Verdict says
	// so in one line.
	Pass    bool   `json:"pass"`
	Verdict string `json:"verdict"`
}

// Machine is where the sweep ran.
type Machine struct {
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
}

// Result is one consumer in one cell: the median of its runs.
type Result struct {
	Broker      string `json:"broker"`
	Parallelism int    `json:"parallelism"` // partitions per topic (Kafka), consumers per topic (Redis)
	Handlers    int    `json:"handlers"`
	Cost        string `json:"cost"`
	Consumer    string `json:"consumer"`         // bare or spillway
	Budget      int64  `json:"budget,omitempty"` // Spillway's vertex budget
	// Backlog is the cell's messages; Messages those handled inside the
	// window (the median over the runs): the ones handled before the last
	// handler started are left out.
	Backlog  int `json:"backlog"`
	Messages int `json:"messages"`

	Seconds           float64 `json:"seconds"`
	MessagesPerSecond float64 `json:"messages_per_second"`
	// VerticesPerSecond is MessagesPerSecond times the backlog's mean
	// vertices per message.
	VerticesPerSecond float64 `json:"vertices_per_second"`
	// CPUPerMessage is this process's user + system CPU per message, in
	// microseconds (the brokers run in processes of their own).
	CPUPerMessage float64 `json:"cpu_us_per_message"`
	PeakHeapBytes uint64  `json:"peak_heap_bytes"`
	// CPURatio is CPUPerMessage over the bare subscriber's in the same
	// cell, and ThroughputRatio MessagesPerSecond over its (Spillway rows
	// only).
	CPURatio        float64 `json:"cpu_ratio,omitempty"`
	ThroughputRatio float64 `json:"throughput_ratio,omitempty"`
	// CPUNoise (Spillway rows only) is how far apart the runs of one
	// consumer in this cell were, in CPU µs per message: the larger of the
	// spread (highest minus lowest) of Spillway's runs and of the bare
	// subscriber's. Zero with one run.
	CPUNoise float64 `json:"cpu_noise_us,omitempty"`
	// Failures counts payloads the handler could not decode (none
	// expected).
	Failures int64 `json:"failures,omitempty"`
}

// Run runs the sweep o describes. A broker that cannot run here (Redis
// without redis-server) is skipped and listed in Report.Skipped; any other
// failure ends the sweep with an error.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	work, _ := refwork.ByName(o.Work)
	pl, err := loadPayloads(o.Costs, o.HeavyVertices)
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Version: 1,
		Machine: Machine{
			GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPUs: runtime.NumCPU(),
			GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(),
		},
		Started: time.Now().UTC().Truncate(time.Second),
		Options: o,
	}
	for _, b := range o.Brokers {
		var rs *redisServer
		if b == BrokerRedis {
			if rs, err = startRedis(); errors.Is(err, ErrNoRedisServer) {
				rep.Skipped = append(rep.Skipped, "redis: "+err.Error())
				o.progress("redis: skipped: %v", err)
				continue
			} else if err != nil {
				return nil, err
			}
		}
		for _, p := range o.Parallelism {
			for _, h := range o.Handlers {
				for _, c := range o.Costs {
					rows, err := runCell(ctx, &o, work, pl, rs, b, p, h, c)
					if ctx.Err() != nil {
						if rs != nil {
							rs.close()
						}
						return nil, ctx.Err()
					}
					if err != nil {
						// One cell failing (a consumer that did not start
						// in time on a loaded machine) leaves the rest of
						// the sweep worth having.
						msg := fmt.Sprintf("%s, %s %d, %d handlers, %s: %v", b, parallelName(b), p, h, c, err)
						rep.Skipped = append(rep.Skipped, msg)
						o.progress("failed: %s", msg)
						continue
					}
					rep.Results = append(rep.Results, rows...)
				}
			}
		}
		if rs != nil {
			rs.close()
		}
	}
	rep.Took = time.Since(rep.Started).Round(time.Second).String()
	rep.check(o.Tolerance)
	return rep, nil
}

// parallelName is what parallelism is on broker b.
func parallelName(b string) string {
	if b == BrokerRedis {
		return "consumers"
	}
	return "partitions"
}

// variant is one consumer of a cell: bare, or Spillway with a budget.
type variant struct {
	consumer string
	budget   int64
}

func (v variant) String() string {
	if v.consumer == ConsumerBare {
		return v.consumer
	}
	return v.consumer + "-" + strconv.FormatInt(v.budget, 10)
}

// runCell publishes a cell's backlog on a fresh broker (Kafka) or an
// emptied one (Redis) and runs each variant on it, o.Runs times, each run
// in a consumer group of its own that reads the backlog from the start.
func runCell(ctx context.Context, o *Options, work refwork.Func, pl *payloads, rs *redisServer, b string, p, h int, c string) ([]Result, error) {
	t := target{broker: b, parallelism: p}
	for j := range h {
		t.topics = append(t.topics, fmt.Sprintf("bench-%s-%d", c, j))
	}
	n := o.messages(c, h)
	msgs, vertices := pl.backlog(c, n)
	per := n / h
	o.progress("%s: %s %d, %d handlers, %s: publishing %d messages", b, parallelName(b), p, h, c, n)
	switch b {
	case BrokerKafka:
		k, err := kafkaproc.Start(p, t.topics)
		if err != nil {
			return nil, err
		}
		defer k.Close()
		t.kafka = k.Brokers
		for j, topic := range t.topics {
			if err := publishKafka(t.kafka, topic, msgs[j*per:(j+1)*per]); err != nil {
				return nil, err
			}
		}
	case BrokerRedis:
		if err := rs.flush(ctx); err != nil {
			return nil, err
		}
		t.redisAddr = rs.addr
		for j, topic := range t.topics {
			if err := rs.Publish(ctx, topic, msgs[j*per:(j+1)*per]); err != nil {
				return nil, fmt.Errorf("scaling: %w", err)
			}
		}
	}

	variants := []variant{{consumer: ConsumerBare}}
	for _, bu := range o.Budgets {
		variants = append(variants, variant{consumer: ConsumerSpillway, budget: bu})
	}
	samples := make(map[variant][]sample, len(variants))
	for r := range o.Runs {
		order := slices.Clone(variants)
		if r%2 == 1 {
			slices.Reverse(order) // alternate, so no variant always runs first
		}
		for _, v := range order {
			group := fmt.Sprintf("%s-r%d", v, r)
			s, err := measure(ctx, o, work, h, n, func(hf handlerFor) (*consumer, error) {
				if v.consumer == ConsumerBare {
					return newBare(t, group, hf)
				}
				return newSpillway(t, group, v.budget, hf)
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v, err)
			}
			samples[v] = append(samples[v], s)
			o.progress("%s: %s %d, %d handlers, %s: %s: %d messages in the window, %.0f msg/s, %.1f µs CPU/msg",
				b, parallelName(b), p, h, c, v, s.messages, float64(s.messages)/s.seconds, 1e6*s.cpuSeconds/float64(s.messages))
		}
	}

	rows := make([]Result, 0, len(variants))
	for _, v := range variants {
		ss := samples[v]
		r := Result{
			Broker: b, Parallelism: p, Handlers: h, Cost: c, Consumer: v.consumer, Budget: v.budget,
			Backlog: n,
		}
		perMessage := float64(vertices) / float64(n)
		r.Messages = int(median(ss, func(s sample) float64 { return float64(s.messages) }))
		r.Seconds = median(ss, func(s sample) float64 { return s.seconds })
		r.MessagesPerSecond = median(ss, func(s sample) float64 { return float64(s.messages) / s.seconds })
		r.VerticesPerSecond = r.MessagesPerSecond * perMessage
		r.CPUPerMessage = median(ss, func(s sample) float64 { return 1e6 * s.cpuSeconds / float64(s.messages) })
		r.PeakHeapBytes = uint64(median(ss, func(s sample) float64 { return float64(s.peakHeap) }))
		for _, s := range ss {
			r.Failures += s.failures
		}
		if v.consumer == ConsumerSpillway && rows[0].CPUPerMessage > 0 && rows[0].MessagesPerSecond > 0 {
			r.CPURatio = r.CPUPerMessage / rows[0].CPUPerMessage
			r.ThroughputRatio = r.MessagesPerSecond / rows[0].MessagesPerSecond
			r.CPUNoise = max(cpuSpread(ss), cpuSpread(samples[variants[0]]))
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// cpuSpread is the highest CPU µs per message of the runs in ss minus the
// lowest.
func cpuSpread(ss []sample) float64 {
	if len(ss) < 2 {
		return 0
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		v := 1e6 * s.cpuSeconds / float64(s.messages)
		lo, hi = min(lo, v), max(hi, v)
	}
	return hi - lo
}

// median returns the median of f over ss (the mean of the middle two for
// an even count).
func median(ss []sample, f func(sample) float64) float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	slices.Sort(v)
	switch n := len(v); {
	case n == 0:
		return 0
	case n%2 == 1:
		return v[n/2]
	default:
		return (v[n/2-1] + v[n/2]) / 2
	}
}
