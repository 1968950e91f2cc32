package scaling

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/cmd/internal/kafkaproc"
	"github.com/spillway-go/spillway/internal/serialtest"
)

// The sweep runs its Kafka broker as a child process of this test binary.
func TestMain(m *testing.M) {
	if kafkaproc.ServeIfAsked() {
		return
	}
	os.Exit(m.Run())
}

// tinyOptions is a sweep of seconds: one message cost, two parallelisms,
// two budgets, a hundred messages, two runs.
func tinyOptions() Options {
	o := DefaultOptions()
	o.Parallelism = []int{1, 2}
	o.Handlers = []int{1}
	o.Costs = []string{CostPing}
	o.Budgets = []int64{1_000, 100_000}
	o.Messages = 100
	o.Runs = 2        // the order alternates, the medians are means of two
	o.Tolerance = 100 // one tiny run says nothing about growth: only the mechanics are checked
	o.StartTimeout = time.Minute
	o.RunTimeout = time.Minute
	return o
}

// TestTinyCurve runs a tiny sweep on every broker available and checks the
// report, the table and the chart, so that the command cannot rot. The
// full sweep is "make bench-curve".
func TestTinyCurve(t *testing.T) {
	if testing.Short() {
		t.Skip("runs embedded Kafka and redis-server")
	}
	// It burns both cores for a while: not at the same time as the
	// scenarios that calibrate their deadlines to this machine.
	serialtest.Exclusive(t)
	before := goleak.IgnoreCurrent() // the goroutines running now
	defer func() {
		// watermill-redisstream's read loop may still be in its pause
		// after a failed read (the block time, 500 ms) when Close returns;
		// it ends by itself after.
		time.Sleep(time.Second)
		goleak.VerifyNone(t,
			goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
			goleak.IgnoreAnyFunction("github.com/IBM/sarama.(*currentRefresh).start.func1"), before)
	}()
	o := tinyOptions()
	o.Brokers = []string{BrokerKafka}
	if _, err := exec.LookPath("redis-server"); err == nil {
		o.Brokers = append(o.Brokers, BrokerRedis)
	} else {
		t.Log("redis-server not installed: Kafka only")
	}
	var lines []string
	o.Progress = func(l string) { lines = append(lines, l) }
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(o.Brokers) * 2 * 3; len(rep.Results) != want {
		t.Fatalf("%d results, want %d (brokers x parallelism x {bare, 2 budgets})", len(rep.Results), want)
	}
	for _, r := range rep.Results {
		if r.Backlog != 100 || r.Messages < 1 || r.Messages > 100 || r.MessagesPerSecond <= 0 || r.VerticesPerSecond <= 0 ||
			r.CPUPerMessage <= 0 || r.PeakHeapBytes == 0 || r.Failures != 0 {
			t.Errorf("implausible result %+v", r)
		}
		if (r.Consumer == ConsumerSpillway) != (r.CPURatio > 0) || (r.Consumer == ConsumerSpillway) != (r.Budget > 0) {
			t.Errorf("ratio or budget on the wrong row: %+v", r)
		}
	}
	// Per broker: the parallelism axis at each budget, the budget axis at
	// each parallelism; one handler count, so no handler checks.
	if want := len(o.Brokers) * 4; len(rep.Checks) != want {
		t.Errorf("%d checks, want %d: %+v", len(rep.Checks), want, rep.Checks)
	}
	if !rep.Pass || !strings.HasPrefix(rep.Verdict, "verdict: PASS") {
		t.Errorf("verdict %q (pass %t) with tolerance %v", rep.Verdict, rep.Pass, o.Tolerance)
	}
	if len(lines) == 0 {
		t.Error("no progress lines")
	}

	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CPU µs/msg", "spillway", "bare", "checks:", rep.Verdict} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	var svg bytes.Buffer
	if err := rep.WriteChart(&svg); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(svg.Bytes()), []byte("<?xml")) || !bytes.Contains(svg.Bytes(), []byte("kafka: CPU µs per message")) {
		t.Errorf("chart:\n%.300s", svg.String())
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Fatal(err)
	}
}

// A ratio that rises along an axis beyond the tolerance fails the check,
// within it passes, and the verdict names the worst case.
func TestCheckGrowth(t *testing.T) {
	// The bare subscriber takes 100 µs per message in every cell, so the
	// extra CPU per message is 100 × (ratio − 1) µs.
	row := func(p, h int, budget int64, ratio float64) Result {
		return Result{Broker: BrokerKafka, Parallelism: p, Handlers: h, Cost: CostPing, Consumer: ConsumerSpillway, Budget: budget,
			CPURatio: ratio, CPUPerMessage: 100 * ratio, CPUNoise: 5}
	}
	rep := &Report{Options: Options{Runs: 3}, Results: []Result{
		{Broker: BrokerKafka, Parallelism: 1, Handlers: 1, Cost: CostPing, Consumer: ConsumerBare}, // no ratio: ignored
		row(1, 1, 1000, 1.10), row(4, 1, 1000, 1.30), row(48, 1, 1000, 1.20), // +18 %: within 25 %
		row(1, 8, 1000, 1.20), // handlers 1 → 8 at parallelism 1: +9 %
		row(1, 1, 9000, 1.50), // budget 1000 → 9000 at parallelism 1: +36 %
	}}
	rep.check(0.25)
	got := map[string]Check{}
	for _, c := range rep.Checks {
		got[c.Axis+" "+c.Fixed] = c
	}
	if len(got) != 3 {
		t.Fatalf("checks %+v, want 3", rep.Checks)
	}
	if c := got["parallelism handlers 1, budget 1000"]; c.Grew || c.From != 1 || c.To != 4 || c.ToRatio != 1.30 {
		t.Errorf("parallelism check %+v, want 1 → 4 (the highest ratio), within tolerance", c)
	}
	if c := got["handlers partitions 1, budget 1000"]; c.Grew || c.To != 8 {
		t.Errorf("handlers check %+v", c)
	}
	if c := got["budget partitions 1, handlers 1"]; !c.Grew || c.From != 1000 || c.To != 9000 || math.Abs(c.Growth-40) > 1e-9 || c.Noise != 5 {
		t.Errorf("budget check %+v, want growth of 40 µs over noise 5", c)
	}
	if rep.Pass || !strings.HasPrefix(rep.Verdict, "verdict: FAIL") || !strings.Contains(rep.Verdict, "grows with budget in 1 of 3 checks") {
		t.Errorf("verdict %q", rep.Verdict)
	}

	// The same rise is no growth when the runs of one cell differ by more
	// than it: a heavy cell where the handler's milliseconds swamp
	// Spillway's microseconds.
	rep.Results[5].CPUNoise = 41
	rep.check(0.25)
	if !rep.Pass || !strings.HasPrefix(rep.Verdict, "verdict: PASS") {
		t.Errorf("with a rise inside the noise: %q %+v", rep.Verdict, rep.Checks)
	}
	rep.Results[5].CPUNoise = 39
	rep.check(0.25)
	if rep.Pass {
		t.Errorf("with a rise just above the noise: %q", rep.Verdict)
	}

	rep.check(0.5)
	if !rep.Pass || !strings.HasPrefix(rep.Verdict, "verdict: PASS") {
		t.Errorf("with tolerance 50%%: %q", rep.Verdict)
	}
	rep.Results = rep.Results[:2]
	rep.check(0.25)
	if !rep.Pass || !strings.Contains(rep.Verdict, "NOT CHECKED") {
		t.Errorf("with nothing to compare: %q", rep.Verdict)
	}
}

// TestCheckNeedsRuns: with one run per cell (spillway bench --quick) the
// noise cannot be estimated, so a rise that would fail a judged sweep is
// listed but not judged, and the verdict says how many runs it needs
// instead of FAIL.
func TestCheckNeedsRuns(t *testing.T) {
	row := func(budget int64, ratio float64) Result {
		return Result{Broker: BrokerKafka, Parallelism: 1, Handlers: 1, Cost: CostPing, Consumer: ConsumerSpillway, Budget: budget,
			CPURatio: ratio, CPUPerMessage: 100 * ratio}
	}
	rep := &Report{Options: Options{Runs: 1}, Results: []Result{row(1000, 1.0), row(9000, 1.5)}}
	rep.check(0.25)
	if len(rep.Checks) != 1 || rep.Checks[0].Grew {
		t.Errorf("checks %+v, want one, not judged to grow", rep.Checks)
	}
	if want := "verdict: not judged (needs --runs ≥ 2 to estimate noise"; !rep.Pass || !strings.HasPrefix(rep.Verdict, want) {
		t.Errorf("one run: pass %t, verdict %q, want it to start %q", rep.Pass, rep.Verdict, want)
	}
	var out strings.Builder
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "not judged") || strings.Contains(out.String(), "GROWS") {
		t.Errorf("table:\n%s", out.String())
	}

	// Two runs measure a spread (here none): the same rise fails.
	rep.Options.Runs = 2
	rep.check(0.25)
	if rep.Pass || !strings.HasPrefix(rep.Verdict, "verdict: FAIL") {
		t.Errorf("two runs: pass %t, verdict %q", rep.Pass, rep.Verdict)
	}
}

func TestValidate(t *testing.T) {
	for name, f := range map[string]func(*Options){
		"broker":      func(o *Options) { o.Brokers = []string{"nats"} },
		"cost":        func(o *Options) { o.Costs = []string{"huge"} },
		"parallelism": func(o *Options) { o.Parallelism = []int{0} },
		"handlers":    func(o *Options) { o.Handlers = []int{100} },
		"budget":      func(o *Options) { o.Budgets = []int64{-1} },
		"messages":    func(o *Options) { o.Messages = 0 },
		"runs":        func(o *Options) { o.Runs = 0 },
		"work":        func(o *Options) { o.Work = "sleep" },
		"empty":       func(o *Options) { o.Costs = nil },
		"tolerance":   func(o *Options) { o.Tolerance = -1 },
	} {
		o := DefaultOptions()
		f(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if err := DefaultOptions().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	if err := QuickOptions().Validate(); err != nil {
		t.Errorf("quick: %v", err)
	}
}

// Each handler gets the same share of a cell's backlog, at least one
// message.
func TestBacklogSize(t *testing.T) {
	o := DefaultOptions()
	o.Messages = 1000
	for _, tc := range []struct {
		cost     string
		handlers int
		want     int
	}{
		{CostPing, 1, 1000}, {CostPing, 8, 1000}, {CostPing, 3, 999},
		{CostPolygon, 1, 500}, {CostHeavy, 1, 10}, {CostHeavy, 8, 8}, {CostHeavy, 16, 16},
	} {
		if got := o.messages(tc.cost, tc.handlers); got != tc.want {
			t.Errorf("%s, %d handlers: %d messages, want %d", tc.cost, tc.handlers, got, tc.want)
		}
	}
}
