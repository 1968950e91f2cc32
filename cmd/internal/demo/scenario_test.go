package demo

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/serialtest"
)

// smallOptions is the demo scenario scaled down for a test: a short stream,
// one heavy multipolygon per partition, a 3 s deadline. The handler's work
// is calibrated on this machine (with -race if it is on), so one heavy
// message takes a third of the deadline alone whatever the load: the plain
// consumer has twelve of them in flight on two cores when the second
// member joins, four times what drains within the deadline.
func smallOptions() Options {
	o := DefaultOptions()
	o.Duration = 8 * time.Second
	o.PingRate, o.Vehicles, o.ParcelRate = 40, 40, 8
	o.Burst, o.BurstAt = 12, 2*time.Second
	o.HeavyVertices = 10_000
	o.Deadline = 3 * time.Second
	o.Heartbeat = 250 * time.Millisecond
	o.JoinAfter = 750 * time.Millisecond
	o.Drain = 12 * time.Second
	o.CalibrationRepeats = 1
	o.StopWhenFailed = true
	return o
}

// TestScenario runs the plain consumer and the Spillway group (with its
// light lane for positions) end to end on embedded Kafka and checks what is
// robust on a loaded two-core machine: the plain consumer shows the failure
// (work done twice, a member evicted, or a rebalance past the deadline),
// Spillway shows none of it, accounts for every message, and its pings do
// not wait as long as the plain consumer's. The single-lane group is left
// to the demo's report: it only adds a baseline and a minute.
func TestScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end demo scenario: about 40 s")
	}
	serialtest.Exclusive(t) // not at the same time as router's heavy burst
	o := smallOptions()
	o.OnPhase = func(s string) { t.Log(s) }
	o.Groups = []string{GroupNaive, GroupSpillway}
	began := time.Now()
	rec, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	s := rec.Summarize()
	var table strings.Builder
	_ = s.WriteTable(&table)
	t.Logf("calibration: %d passes, heavy %.2fs alone, %.0f vertices/s, budget %d; took %s\n%s",
		rec.Calibration.Passes, rec.Calibration.HeavySeconds, rec.Calibration.VerticesPerSecond, rec.Calibration.Budget,
		time.Since(began).Round(time.Second), table.String())
	if len(s.Groups) != 2 {
		t.Fatalf("%d groups ran", len(s.Groups))
	}
	naive, sp := s.Groups[0], s.Groups[1]
	if !naive.Failed() {
		t.Errorf("the plain consumer did not fail (no duplicate, eviction or late rebalance): the scenario proves nothing")
	}
	if sp.Duplicates != 0 {
		t.Errorf("spillway: %d messages processed twice", sp.Duplicates)
	}
	if sp.Evictions != 0 || sp.LostMembership != 0 {
		t.Errorf("spillway: evicted (%d evictions, %d membership errors)", sp.Evictions, sp.LostMembership)
	}
	if sp.LateRebalance {
		t.Errorf("spillway: rebalance took %.1fs, deadline %s", sp.RebalanceSeconds, o.Deadline)
	}
	if sp.Unprocessed != 0 {
		t.Errorf("spillway: %d messages neither processed, shed nor dead-lettered", sp.Unprocessed)
	}
	if sp.PositionsP99 >= naive.PositionsP99 {
		t.Errorf("spillway: positions p99 %.2fs, the plain consumer's %.2fs: the light lane did not keep pings clear",
			sp.PositionsP99, naive.PositionsP99)
	}
	if sp.StartBudget <= 0 {
		t.Errorf("spillway: no budget recorded")
	}
	for _, g := range rec.Groups {
		if len(g.Series) == 0 || len(g.Latencies) == 0 {
			t.Errorf("%s: empty recording (%d samples, %d latencies)", g.Name, len(g.Series), len(g.Latencies))
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		mut  func(*Options)
		want string
	}{
		"broker":     {func(o *Options) { o.Broker = "nats" }, "broker must be kafka or redis"},
		"deadline":   {func(o *Options) { o.Deadline = 1500 * time.Microsecond }, "deadline"},
		"heartbeat":  {func(o *Options) { o.Heartbeat = 5 * time.Second }, "heartbeat"},
		"memory":     {func(o *Options) { o.MemoryBytes = -1 }, "memory"},
		"group":      {func(o *Options) { o.Groups = []string{"fast"} }, `unknown group "fast"`},
		"burst time": {func(o *Options) { o.BurstAt = time.Hour }, "burst time"},
		"fail rate":  {func(o *Options) { o.FailRate = 1 }, "fail rate"},
	} {
		o := DefaultOptions()
		tc.mut(&o)
		err := o.Validate()
		if !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrBadOptions mentioning %q", name, err, tc.want)
		}
	}
	if err := DefaultOptions().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func TestGenerateIsReproducible(t *testing.T) {
	g, err := LoadGeometry()
	if err != nil {
		t.Fatal(err)
	}
	cfg := smallOptions().streamConfig()
	a, err := Generate(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate(g, cfg)
	if len(a.Messages) != len(b.Messages) {
		t.Fatalf("%d and %d messages", len(a.Messages), len(b.Messages))
	}
	for i := range a.Messages {
		x, y := a.Messages[i], b.Messages[i]
		if x.UUID != y.UUID || x.Key != y.Key || string(x.Payload) != string(y.Payload) || x.At != y.At {
			t.Fatalf("message %d differs: %s vs %s", i, x.UUID, y.UUID)
		}
	}
	if a.Count[KindHeavy] != 12 || a.Count[KindPing] != 320 || a.Count[KindParcel] != 64 {
		t.Errorf("counts %v", a.Count)
	}
	// Each partition gets one heavy message, and pings carry increasing
	// versions per vehicle.
	keys := map[string]bool{}
	last := map[string]uint64{}
	for _, m := range a.Messages {
		switch m.Kind {
		case KindHeavy:
			keys[m.Key] = true
			if m.Vertices < cfg.HeavyVertices {
				t.Errorf("heavy %s has %d vertices", m.UUID, m.Vertices)
			}
		case KindPing:
			if m.Version <= last[m.Key] {
				t.Errorf("%s: version %d after %d", m.Key, m.Version, last[m.Key])
			}
			last[m.Key] = m.Version
		}
	}
	if len(keys) != 12 {
		t.Errorf("heavy messages on %d distinct keys, want 12", len(keys))
	}
}

func TestRedisNeedsARealServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no redis-server
	o := smallOptions()
	o.Broker = "redis"
	_, err := Run(context.Background(), o)
	if !errors.Is(err, ErrNoRedisServer) && !errors.Is(err, ErrRedisNotSupported) {
		t.Fatalf("err %v, want ErrNoRedisServer (or ErrRedisNotSupported)", err)
	}
	if !strings.Contains(err.Error(), "redis-server") {
		t.Errorf("the error does not say what to install: %v", err)
	}
}

func TestSweepSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the sweep: about 10 s")
	}
	o := DefaultSweepOptions()
	o.Work, o.Rounds, o.Factors = time.Second, 1, []float64{1, 4}
	r, err := Sweep(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Runs) != 4 {
		t.Fatalf("%d runs, want 2 fixed and 2 auto", len(r.Runs))
	}
	for _, run := range r.Runs {
		if run.VerticesPS <= 0 || run.MaxProcess <= 0 || run.Seconds <= 0 {
			t.Errorf("%s: %+v", run.Name, run)
		}
		if run.GoodputPS > run.VerticesPS*1.0001 {
			t.Errorf("%s: goodput %v above throughput %v", run.Name, run.GoodputPS, run.VerticesPS)
		}
		if len(run.RoundGoodput) != o.Rounds || run.RoundGoodput[0] != run.GoodputPS {
			t.Errorf("%s: round goodput %v, want the one round's %v", run.Name, run.RoundGoodput, run.GoodputPS)
		}
		if r.BestFixed >= 0 && (len(run.RoundShare) != o.Rounds || math.Abs(run.RoundShare[0]-run.ShareOfBest) > 1e-9) {
			t.Errorf("%s: round shares %v, want the one round's %v", run.Name, run.RoundShare, run.ShareOfBest)
		}
	}
	if r.Runs[0].Budget != r.Runs[1].Budget/4 {
		t.Errorf("fixed budgets %d and %d, want a factor of 4", r.Runs[0].Budget, r.Runs[1].Budget)
	}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil || !strings.Contains(b.String(), "auto (from the calibrated budget)") ||
		!strings.Contains(b.String(), "from the smallest start") && r.BestFixed >= 0 {
		t.Errorf("table (%v):\n%s", err, b.String())
	}
}
