package autoscale

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The controllers a run can scale with.
const (
	// ControlDrain scales on Spillway's drain time: ceil(backlog seconds
	// / target), the backlog seconds read from the workers' metrics as
	// docs/scaling.md's query reads them.
	ControlDrain = "drain-time"
	// ControlLag scales on message lag as KEDA does: ceil(lag /
	// threshold), the threshold tuned to the stream's average message.
	ControlLag = "message-lag"
	// ControlLagLow is ControlLag with the threshold tuned to the
	// boundaries, low enough to meet the target on them.
	ControlLagLow = "message-lag-low"
)

// RunSpec is one run: which workers, scaled by which controller.
type RunSpec struct {
	Workers    string `json:"workers"`
	Controller string `json:"controller"`
}

// Options configure the experiment.
type Options struct {
	Brokers []string  `json:"brokers"`
	Runs    []RunSpec `json:"runs"`
	// Partitions of the Kafka topic; the Kafka runs scale to at most
	// this many processes.
	Partitions   int `json:"partitions"`
	MaxProcesses int `json:"max_processes"`
	// Target is the drain-time target, and the wait the message-lag
	// thresholds are tuned to.
	Target time.Duration `json:"target"`
	// Tick is how often the controller decides; ScaleDownWindow is its
	// scale-in stabilization window (an HPA's behavior.scaleDown).
	Tick            time.Duration `json:"tick"`
	ScaleDownWindow time.Duration `json:"scale_down_window"`
	Stream          StreamSpec    `json:"stream"`
	Work            WorkModel     `json:"work"`
	// Budget is each Spillway worker's vertex budget, fixed unless
	// SizeEvery is set; then it is the auto-sizer's start, and SizeEvery
	// its measuring window (budget.autosize.window), and the drain rate
	// the workers export is the auto-sizer's measured throughput.
	Budget    int64         `json:"budget"`
	SizeEvery time.Duration `json:"size_every"`
	// Consumers is how many Redis consumers each worker runs.
	Consumers int `json:"consumers"`
	// LagEvery is the Spillway workers' telemetry.lag_interval.
	LagEvery time.Duration `json:"lag_every"`
	// DrainTimeout is how long a run waits, after the last burst, for
	// every message to be finished and the fleet to be back at one
	// process; a message not finished by then is lost.
	DrainTimeout time.Duration `json:"drain_timeout"`
	// Progress, when set, receives a line as each run starts and ends.
	Progress func(string) `json:"-"`
}

// DefaultOptions is the full experiment: about seven minutes on two cores.
func DefaultOptions() Options {
	return Options{
		Brokers: []string{BrokerKafka, BrokerRedis},
		Runs: []RunSpec{
			{KindSpillway, ControlDrain}, {KindSpillway, ControlLag}, {KindSpillway, ControlLagLow}, {KindPlain, ControlLag},
		},
		Partitions:      8,
		MaxProcesses:    8,
		Target:          8 * time.Second,
		Tick:            2 * time.Second,
		ScaleDownWindow: 10 * time.Second,
		Stream: StreamSpec{
			Seed: 36, Length: 48 * time.Second, Every: 6 * time.Second,
			Pings: [2]int{1500, 3000}, Boundaries: [2]int{8, 16}, MinBoundary: 1000,
		},
		Work:         WorkModel{PerMessage: 500 * time.Microsecond, PerVertex: 400 * time.Microsecond, Slots: 1},
		Budget:       8000,
		SizeEvery:    5 * time.Second,
		Consumers:    4,
		LagEvery:     2 * time.Second,
		DrainTimeout: 60 * time.Second,
	}
}

// QuickOptions is a run of seconds for the tests: Kafka, the drain-time
// and message-lag controllers on Spillway workers, a short stream of work
// ten times cheaper.
func QuickOptions() Options {
	o := DefaultOptions()
	o.Brokers = []string{BrokerKafka}
	o.Runs = []RunSpec{{KindSpillway, ControlDrain}, {KindSpillway, ControlLag}}
	o.Target = 3 * time.Second
	o.Tick = time.Second
	o.ScaleDownWindow = 3 * time.Second
	o.Stream.Length = 12 * time.Second
	o.Stream.Every = 4 * time.Second
	o.Stream.Pings = [2]int{300, 500}
	o.Stream.Boundaries = [2]int{10, 12}
	o.Work = WorkModel{PerMessage: 200 * time.Microsecond, PerVertex: 300 * time.Microsecond, Slots: 1}
	o.LagEvery = 500 * time.Millisecond
	o.SizeEvery = time.Second
	o.DrainTimeout = 30 * time.Second
	return o
}

// Validate reports every bad option.
func (o Options) Validate() error {
	var errs []error
	if len(o.Brokers) == 0 || len(o.Runs) == 0 {
		errs = append(errs, errors.New("brokers and runs each need at least one value"))
	}
	for _, b := range o.Brokers {
		if b != BrokerKafka && b != BrokerRedis {
			errs = append(errs, fmt.Errorf("unknown broker %q: want kafka or redis", b))
		}
	}
	for _, r := range o.Runs {
		if r.Workers != KindSpillway && r.Workers != KindPlain {
			errs = append(errs, fmt.Errorf("run %s/%s: unknown workers %q: want spillway or plain", r.Workers, r.Controller, r.Workers))
		}
		switch r.Controller {
		case ControlLag, ControlLagLow:
		case ControlDrain:
			if r.Workers != KindSpillway {
				errs = append(errs, fmt.Errorf("run %s/%s: the drain-time controller reads Spillway's metrics: use spillway workers", r.Workers, r.Controller))
			}
		default:
			errs = append(errs, fmt.Errorf("run %s/%s: unknown controller %q: want %s, %s or %s", r.Workers, r.Controller, r.Controller, ControlDrain, ControlLag, ControlLagLow))
		}
	}
	if o.Partitions < 1 || o.MaxProcesses < 1 {
		errs = append(errs, errors.New("partitions and max processes must be at least 1"))
	}
	if o.Target <= 0 || o.Tick <= 0 || o.Stream.Length <= 0 || o.Stream.Every <= 0 {
		errs = append(errs, errors.New("target, tick, stream length and burst interval must be positive"))
	}
	if o.Work.Slots < 1 || o.Work.PerVertex <= 0 {
		errs = append(errs, errors.New("the handler needs at least one slot and a positive time per vertex"))
	}
	return errors.Join(errs...)
}

// thresholds returns the message-lag thresholds: tuned to the stream's
// average message (target × one process's messages per second on it),
// and to its average boundary.
func thresholds(o Options, m mix) (avg, low int64) {
	perProcess := func(avgV float64) float64 { // messages per second
		return o.Work.VerticesPerSecond(avgV) / avgV
	}
	avgV := float64(m.vertices) / float64(max(m.messages, 1))
	avg = int64(math.Ceil(o.Target.Seconds() * perProcess(avgV)))
	bV := float64(m.boundaryVertices) / float64(max(m.boundaryMessages, 1))
	low = max(int64(math.Floor(o.Target.Seconds()*perProcess(bV))), 1)
	return max(avg, 1), low
}

// Report is the experiment's outcome.
type Report struct {
	Started time.Time `json:"started"`
	Took    string    `json:"took"`
	Options Options   `json:"options"`
	Stream  struct {
		Messages int   `json:"messages"`
		Vertices int64 `json:"vertices"`
		Bursts   int   `json:"bursts"`
	} `json:"stream"`
	Runs    []Result `json:"runs"`
	Skipped []string `json:"skipped,omitempty"`
	// LoadBefore and LoadAfter are the machine's one-minute load average.
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
}

// Result is one run.
type Result struct {
	Broker     string `json:"broker"`
	Workers    string `json:"workers"`
	Controller string `json:"controller"`
	// Threshold is the message-lag controller's lag per process.
	Threshold int64 `json:"threshold,omitempty"`
	Messages  int   `json:"messages"`
	// LongestWait and OverTarget are in seconds (see outcome).
	LongestWait float64 `json:"longest_wait_s"`
	OverTarget  float64 `json:"over_target_s"`
	// ProcessSeconds is the sum of every worker's lifetime during the
	// run.
	ProcessSeconds float64 `json:"process_seconds"`
	MaxProcesses   int     `json:"max_processes"`
	ScaleOuts      int     `json:"scale_outs"`
	ScaleIns       int     `json:"scale_ins"`
	Duplicates     int     `json:"duplicates"`
	Lost           int     `json:"lost"`
	// Seconds is the run's length, from the first burst until every
	// message is finished and the fleet is back at one process (or the
	// drain timeout).
	Seconds float64 `json:"seconds"`
	// BrokerCPU is the broker process's CPU seconds during the run.
	BrokerCPU float64 `json:"broker_cpu_s"`
	// Timeline samples the run every half second; Decisions are the
	// controller's.
	Timeline  []Point    `json:"timeline"`
	Decisions []Decision `json:"decisions"`
	// Failures are workers that exited with an error.
	Failures []string `json:"failures,omitempty"`
}

// Point is the fleet at T seconds: processes running (serving or closing)
// and the true backlog in vertices (sent and not yet finished).
type Point struct {
	T         float64 `json:"t"`
	Processes int     `json:"processes"`
	Backlog   int64   `json:"backlog_vertices"`
}

// Decision is one controller step: its input (drain seconds or lag in
// messages; -1 when it had none), its answer and the size it scaled to.
type Decision struct {
	T       float64 `json:"t"`
	Input   float64 `json:"input"`
	Desired int     `json:"desired"`
	Size    int     `json:"size"`
	// Backlog and Rate are the drain-time signal's parts: the backlog
	// in vertices and the average drain rate over Rates workers.
	Backlog float64 `json:"backlog_vertices,omitempty"`
	Rate    float64 `json:"rate,omitempty"`
	Rates   int     `json:"rates,omitempty"`
}

// Run runs the experiment.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	bursts, err := o.Stream.Build()
	if err != nil {
		return nil, err
	}
	rep := &Report{Started: time.Now(), Options: o, LoadBefore: loadAverage()}
	m := mixOf(bursts)
	rep.Stream.Messages, rep.Stream.Vertices, rep.Stream.Bursts = m.messages, m.vertices, len(bursts)
	for _, bname := range o.Brokers {
		var topics []string
		for i := range o.Runs {
			topics = append(topics, fmt.Sprintf("fleet-%d", i))
		}
		b, err := startBroker(bname, o.Partitions, topics)
		if errors.Is(err, ErrNoRedisServer) {
			rep.Skipped = append(rep.Skipped, err.Error())
			continue
		}
		if err != nil {
			return nil, err
		}
		for i, rs := range o.Runs {
			if o.Progress != nil {
				o.Progress(fmt.Sprintf("%s: %s workers, %s controller...", bname, rs.Workers, rs.Controller))
			}
			res, err := runOne(ctx, o, b, topics[i], rs, bursts)
			if err != nil {
				b.close()
				return nil, fmt.Errorf("autoscale: %s %s/%s: %w", bname, rs.Workers, rs.Controller, err)
			}
			if o.Progress != nil {
				o.Progress(fmt.Sprintf("  longest wait %.1fs, over target %.1fs, %.0f process-s, %d/%d scale events, %d duplicates, %d lost",
					res.LongestWait, res.OverTarget, res.ProcessSeconds, res.ScaleOuts, res.ScaleIns, res.Duplicates, res.Lost))
			}
			rep.Runs = append(rep.Runs, res)
		}
		b.close()
	}
	rep.LoadAfter = loadAverage()
	rep.Took = time.Since(rep.Started).Round(time.Second).String()
	return rep, nil
}

// loadAverage is the one-minute load average (0 where /proc has none).
func loadAverage() float64 {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// runOne runs the stream through one fleet and measures it.
func runOne(ctx context.Context, o Options, b *broker, topic string, rs RunSpec, bursts []Burst) (Result, error) {
	res := Result{Broker: b.name, Workers: rs.Workers, Controller: rs.Controller}
	dir, err := os.MkdirTemp("", "spillway-autoscale-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	prefix := "fleet-" + topic
	group := prefix + "." + handlerName
	limits := Limits{Min: 1, Max: o.MaxProcesses}
	if b.name == BrokerKafka {
		limits.Max = min(limits.Max, o.Partitions) // partition mode: one owner per partition
	}
	avgT, lowT := thresholds(o, mixOf(bursts))
	switch rs.Controller {
	case ControlLag:
		res.Threshold = avgT
	case ControlLagLow:
		res.Threshold = lowT
	}
	spec := workerSpec{
		Kind: rs.Workers, Broker: b.name, Topic: topic, Group: prefix,
		Partitions: int32(o.Partitions), Budget: o.Budget, SizeEvery: o.SizeEvery, Consumers: o.Consumers,
		Work: o.Work, LagEvery: o.LagEvery,
	}
	if b.kafka != nil {
		spec.Kafka = b.kafka.Brokers
	} else {
		spec.Redis = b.redis.Addr
	}
	f, err := newFleet(spec, dir)
	if err != nil {
		return res, err
	}
	defer f.stopAll(5 * time.Second)
	if err := f.scaleTo(limits.Min); err != nil {
		return res, err
	}

	cpu0 := b.cpuSeconds()
	t0 := time.Now()
	var (
		mu      sync.Mutex
		msgs    []sent
		pubErr  error
		pubDone = make(chan struct{})
	)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(pubDone)
		for _, bu := range bursts {
			select {
			case <-time.After(time.Until(t0.Add(bu.At))):
			case <-pctx.Done():
				return
			}
			at := time.Now()
			if err := b.publish(pctx, topic, bu.Items, at); err != nil {
				mu.Lock()
				pubErr = err
				mu.Unlock()
				return
			}
			mu.Lock()
			for _, it := range bu.Items {
				msgs = append(msgs, sent{id: it.ID, at: at, vertices: it.Vertices})
			}
			mu.Unlock()
		}
	}()

	stab := &Stabilizer{Window: o.ScaleDownWindow}
	tick := time.NewTicker(o.Tick)
	defer tick.Stop()
	var drainBy time.Time // set once every burst is out
	total := mixOf(bursts).messages
	for {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-tick.C:
		}
		now := time.Now()
		size := f.size()
		input, desired := -1.0, size
		var sig DrainSignal
		switch rs.Controller {
		case ControlDrain:
			sig = f.scrape(ctx, group)
			if secs, ok := sig.Seconds(); ok {
				input = secs
			}
			desired = DrainDesired(sig, o.Target, size, limits)
		default:
			lag, err := b.lag(ctx, topic, group)
			if err == nil {
				input = float64(lag)
				desired = LagDesired(lag, res.Threshold, limits)
			}
		}
		next := stab.Next(now, desired, size)
		res.Decisions = append(res.Decisions, Decision{
			T: now.Sub(t0).Seconds(), Input: input, Desired: desired, Size: next,
			Backlog: sig.Backlog, Rate: sig.Rate, Rates: sig.Rates,
		})
		if next != size {
			if next > size {
				res.ScaleOuts++
			} else {
				res.ScaleIns++
			}
			if err := f.scaleTo(next); err != nil {
				return res, err
			}
		}
		res.MaxProcesses = max(res.MaxProcesses, next)

		select {
		case <-pubDone:
			mu.Lock()
			err := pubErr
			mu.Unlock()
			if err != nil {
				return res, err
			}
			if drainBy.IsZero() {
				drainBy = now.Add(o.DrainTimeout)
			}
		default:
			continue
		}
		recs, err := readDone(dir)
		if err != nil {
			return res, err
		}
		finished := map[string]bool{}
		for _, r := range recs {
			finished[r.id] = true
		}
		// The run ends when every message is finished and the fleet is
		// back at its minimum: the processes a controller keeps through
		// its stabilization window count.
		if (len(finished) >= total && next == limits.Min) || now.After(drainBy) {
			break
		}
	}
	end := time.Now()
	res.BrokerCPU = b.cpuSeconds() - cpu0
	spans := f.spans(t0, end)
	for _, err := range f.stopAll(90 * time.Second) {
		res.Failures = append(res.Failures, err.Error())
	}
	recs, err := readDone(dir)
	if err != nil {
		return res, err
	}
	oc := analyse(msgs, recs, o.Target, end)
	res.Messages = len(msgs)
	res.LongestWait = oc.LongestWait.Seconds()
	res.OverTarget = oc.OverTarget.Seconds()
	res.Duplicates, res.Lost = oc.Duplicates, oc.Lost
	res.Seconds = end.Sub(t0).Seconds()
	for _, s := range spans {
		res.ProcessSeconds += s[1] - max(s[0], 0)
	}
	for t := 0.0; t <= res.Seconds; t += 0.5 {
		res.Timeline = append(res.Timeline, Point{
			T:         t,
			Processes: processesAt(spans, t),
			Backlog:   backlogAt(msgs, oc.finished, t0.Add(time.Duration(t*float64(time.Second)))),
		})
	}
	return res, nil
}
