package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-go/spillway/cmd/internal/demo"
)

// demoOptions are the flags of "spillway demo".
type demoOptions struct {
	o        demo.Options
	memory   byteSize
	report   string
	json     bool
	results  string
	sweep    bool
	progress bool
	quiet    bool
	groups   []string
	sw       demo.SweepOptions

	kafkaConsumer string
}

func newDemoCmd(e *env) *cobra.Command {
	def := demo.DefaultOptions()
	o := &demoOptions{o: def, memory: byteSize(def.MemoryBytes), sw: demo.DefaultSweepOptions()}
	cmd := &cobra.Command{
		Use:   "demo [flags]",
		Short: "Show a message-count consumer fall over and a Spillway consumer hold, on real geometry",
		Long: `demo streams real geometry from the repository's testdata through an embedded
Kafka broker (kfake) and runs three consumer groups on identical streams, one
after the other:

  naive           Watermill's defaults: watermill-kafka subscribers, concurrency
                  of one unacked message per partition, no budget
  spillway        the Spillway router: a vertex budget measured on this machine
                  and auto-sized online, with a light lane for positions,
                  revocation-aware admission, shedding of the positions topic,
                  the retry gate
  spillway-1lane  the same router with one FIFO budget (no lanes)

The stream: vehicle pings on a sheddable positions topic, parcel polygons and
a burst of heavy multipolygons on a boundaries topic that is never shed. A
second consumer joins each group mid-burst, forcing a rebalance under a short
redelivery deadline (Kafka Rebalance.Timeout, the same for both groups).

It shows a live table while it runs, prints a summary, and writes a
self-contained HTML report with charts (--report). --json prints the summary
as JSON instead, for benchmarks. --sweep runs the goodput sweep instead:
fixed budgets from small to large and an auto-sized one, in process.

The defaults finish in under two minutes on two cores. docs/demo.md explains
what to look at.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), e, o, cmd.Flags().Changed("progress"))
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.o.Broker, "broker", def.Broker, "broker: kafka (embedded kfake) or redis")
	f.DurationVar(&o.o.Duration, "duration", def.Duration, "how long each group's stream is produced")
	f.Float64Var(&o.o.PingRate, "rate", def.PingRate, "vehicle pings per second (positions topic)")
	f.IntVar(&o.o.Vehicles, "vehicles", def.Vehicles, "vehicles pinging")
	f.Float64Var(&o.o.ParcelRate, "parcels", def.ParcelRate, "parcel polygons per second (boundaries topic)")
	f.IntVar(&o.o.Burst, "burst", def.Burst, "heavy multipolygons in the burst (boundaries topic)")
	f.DurationVar(&o.o.BurstAt, "burst-at", def.BurstAt, "when the burst is published, after production starts")
	f.IntVar(&o.o.HeavyVertices, "heavy-vertices", def.HeavyVertices, "vertices per heavy multipolygon (real polygons assembled)")
	f.DurationVar(&o.o.Deadline, "deadline", def.Deadline, "redelivery deadline (Kafka Rebalance.Timeout) of both groups, scaled down for the demo")
	f.DurationVar(&o.o.JoinAfter, "join-after", 0, "when the second consumer joins, after the burst (default deadline/4)")
	f.DurationVar(&o.o.Drain, "drain", def.Drain, "the most each group gets to finish after production ends")
	f.Var(&o.memory, "memory", "memory the consumer gives in-flight geometry: the memory bound (e.g. 96MiB)")
	f.Float64Var(&o.o.FailRate, "fail-rate", def.FailRate, "share of pings and parcels whose first attempt fails (a downstream blip)")
	f.IntVar(&o.o.Partitions, "partitions", def.Partitions, "partitions per topic")
	f.Uint64Var(&o.o.Seed, "seed", def.Seed, "random seed of the stream (the same for both groups)")
	f.IntVar(&o.o.Passes, "passes", 0, "work passes per message (default: calibrated from --heavy-share)")
	f.Float64Var(&o.o.HeavyShare, "heavy-share", 0, "share of the deadline one heavy message takes alone on one core (default 1/3 on kafka, 1/2 on redis)")
	f.StringSliceVar(&o.groups, "groups", def.Groups, "groups to run, in order: "+strings.Join(demo.AllGroups, ", "))
	f.StringVar(&o.kafkaConsumer, "kafka-consumer", "partition", "kafka: partition (the spillway group only) or key (adds the spillway-key group: kafka.consumer key)")
	f.StringVar(&o.report, "report", "demo-report.html", `write the HTML report here ("" for none)`)
	f.BoolVar(&o.json, "json", false, "print the summary as JSON on stdout instead of a table")
	f.StringVar(&o.results, "results", "", "also write the JSON summary to this file")
	f.BoolVar(&o.sweep, "sweep", false, "run the goodput sweep instead of the demo")
	f.DurationVar(&o.sw.Work, "sweep-work", o.sw.Work, "sweep: CPU time of the backlog each budget processes")
	f.IntVar(&o.sw.Rounds, "sweep-rounds", o.sw.Rounds, "sweep: rounds; every budget runs once per round, medians count")
	f.DurationVar(&o.sw.Deadline, "sweep-deadline", o.sw.Deadline, "sweep: the deadline processing must stay inside")
	f.BoolVar(&o.progress, "progress", false, "show the live view even when stderr is not a terminal (--progress=false: never)")
	f.BoolVar(&o.quiet, "quiet", false, "print only the summary")
	return cmd
}

func runDemo(ctx context.Context, e *env, o *demoOptions, progressSet bool) error {
	if ctx == nil {
		ctx = context.Background()
	}
	o.o.MemoryBytes = int64(o.memory)
	o.o.Groups = o.groups
	switch o.kafkaConsumer {
	case "partition":
	case "key":
		if !slices.Contains(o.o.Groups, demo.GroupSpillwayKey) {
			o.o.Groups = append(slices.Clone(o.o.Groups), demo.GroupSpillwayKey)
		}
	default:
		return badInput("--kafka-consumer must be partition or key, got %q", o.kafkaConsumer)
	}
	// A zero in demo.Options means "the default"; on the command line it
	// is a value, and a wrong one.
	switch {
	case o.o.Duration <= 0:
		return badInput("--duration must be positive, got %v", o.o.Duration)
	case o.o.Deadline <= 0:
		return badInput("--deadline must be positive, got %v", o.o.Deadline)
	case o.o.JoinAfter < 0:
		return badInput("--join-after must not be negative, got %v", o.o.JoinAfter)
	case o.o.Drain < 0:
		return badInput("--drain must not be negative, got %v", o.o.Drain)
	case o.memory <= 0:
		return badInput("--memory must be positive, got %d bytes", int64(o.memory))
	case o.o.PingRate <= 0 || o.o.ParcelRate <= 0:
		return badInput("--rate and --parcels must be positive, got %v and %v", o.o.PingRate, o.o.ParcelRate)
	case o.o.Vehicles <= 0 || o.o.Partitions <= 0 || o.o.HeavyVertices <= 0:
		return badInput("--vehicles, --partitions and --heavy-vertices must be positive")
	case o.o.Seed == 0:
		return badInput("--seed must not be 0")
	}
	if err := o.o.Validate(); err != nil {
		return inputError{errors.New(strings.TrimPrefix(strings.TrimPrefix(err.Error(), demo.ErrBadOptions.Error()), ": "))}
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	live := e.stderrTTY
	if progressSet {
		live = o.progress
	}
	view := newLiveView(e.stderr, live, o.quiet, o.o.Groups)
	if o.sweep {
		return runSweep(ctx, e, o, view)
	}
	o.o.OnPhase = view.phase
	o.o.OnProgress = view.update

	// Fail on an unwritable report path now, not after two minutes.
	var report *pendingFile
	if o.report != "" {
		var err error
		if report, err = createPending(o.report); err != nil {
			return badInput("--report: %v", err)
		}
		defer report.discard()
	}

	started := time.Now()
	rec, runErr := demo.Run(ctx, o.o)
	view.done()
	if errors.Is(runErr, demo.ErrRedisNotSupported) || errors.Is(runErr, demo.ErrNoRedisServer) {
		return inputError{fmt.Errorf("--broker redis: %w", runErr)}
	}
	if rec == nil || len(rec.Groups) == 0 {
		if runErr == nil {
			runErr = errors.New("no group ran")
		}
		return runErr
	}
	sum := rec.Summarize()
	if report != nil {
		if err := demo.WriteReport(report.f, rec); err != nil {
			return fmt.Errorf("writing the report: %w", err)
		}
		if err := report.commit(); err != nil {
			return fmt.Errorf("writing the report: %w", err)
		}
		if abs, err := filepath.Abs(o.report); err == nil {
			sum.Report = abs
		} else {
			sum.Report = o.report
		}
	}
	if o.results != "" {
		if err := writeJSONFile(o.results, sum); err != nil {
			return err
		}
	}
	if o.json {
		if err := writeJSON(e.stdout, sum); err != nil {
			return err
		}
	} else {
		printDemoSummary(e.stdout, sum, time.Since(started))
	}
	if runErr != nil {
		if ctx.Err() != nil {
			return errors.New("interrupted; the summary and report cover what ran")
		}
		return runErr
	}
	return nil
}

func printDemoSummary(w io.Writer, s demo.Summary, took time.Duration) {
	broker := "embedded Kafka"
	if s.Options.Broker == "redis" {
		broker = "Redis Streams"
	}
	fmt.Fprintf(w, "\nspillway demo: %d messages (%d pings, %d parcels, %d heavies; %s vertices) per group, "+
		"%s, deadline %s, %d cores, %s in all\n\n",
		s.Stream.Messages, s.Stream.Pings, s.Stream.Parcels, s.Stream.Heavies, group(s.Stream.Vertices),
		broker, s.Options.Deadline, s.Machine.GOMAXPROCS, took.Round(time.Second))
	_ = s.WriteTable(w)
	fmt.Fprintln(w)
	for _, g := range s.Groups {
		fmt.Fprintln(w, g.Verdict(s.Options.Deadline))
	}
	if s.Report != "" {
		fmt.Fprintf(w, "\nreport: %s\n", s.Report)
	}
}

func runSweep(ctx context.Context, e *env, o *demoOptions, view *liveView) error {
	o.sw.Seed = o.o.Seed
	o.sw.OnPhase = view.phase
	res, err := demo.Sweep(ctx, o.sw)
	view.done()
	if err != nil {
		if errors.Is(err, demo.ErrBadOptions) {
			return inputError{err}
		}
		if res == nil || len(res.Runs) == 0 {
			return err
		}
	}
	if o.results != "" {
		if err := writeJSONFile(o.results, res); err != nil {
			return err
		}
	}
	if o.json {
		if err := writeJSON(e.stdout, res); err != nil {
			return err
		}
	} else if err := res.WriteTable(e.stdout); err != nil {
		return err
	}
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func writeJSONFile(path string, v any) error {
	out, err := createPending(path)
	if err != nil {
		return badInput("--results: %v", err)
	}
	defer out.discard()
	if err := writeJSON(out.f, v); err != nil {
		return err
	}
	return out.commit()
}

// liveView shows the running group on stderr: on a terminal a small
// table refreshed in place, elsewhere a line every few seconds.
type liveView struct {
	w      io.Writer
	tty    bool
	quiet  bool
	order  []string
	rows   map[string]demo.Progress
	drawn  int
	last   time.Time
	active bool
}

func newLiveView(w io.Writer, tty, quiet bool, groups []string) *liveView {
	return &liveView{w: w, tty: tty, quiet: quiet, order: slices.Clone(groups), rows: map[string]demo.Progress{}}
}

// phase and update are called from the demo's goroutines, never at once
// (phases happen between groups, progress from one sampler at a time).
func (v *liveView) phase(s string) {
	if v.quiet {
		return
	}
	v.clear()
	fmt.Fprintf(v.w, "• %s\n", s)
	v.draw()
}

func (v *liveView) update(p demo.Progress) {
	if v.quiet {
		return
	}
	v.rows[p.Group] = p
	v.active = true
	if v.tty {
		v.clear()
		v.draw()
		return
	}
	if time.Since(v.last) >= 5*time.Second {
		v.last = time.Now()
		fmt.Fprintln(v.w, "  "+formatRow(p))
	}
}

func (v *liveView) done() {
	if v.quiet || !v.tty {
		return
	}
	v.drawn = 0 // leave the final table on screen
}

func (v *liveView) clear() {
	if !v.tty || v.drawn == 0 {
		return
	}
	fmt.Fprintf(v.w, "\x1b[%dA\x1b[J", v.drawn)
	v.drawn = 0
}

func (v *liveView) draw() {
	if !v.tty || !v.active {
		return
	}
	lines := []string{"  " + liveHeader}
	for _, g := range v.order {
		if p, ok := v.rows[g]; ok {
			lines = append(lines, "  "+formatRow(p))
		} else {
			lines = append(lines, fmt.Sprintf("  %-9s waiting", g))
		}
	}
	for _, l := range lines {
		fmt.Fprintln(v.w, l)
	}
	v.drawn = len(lines)
}

const liveHeader = "group      time   done/published  vertices/s  budget fill   in flight    lag   shed  redeliv  dups  evict"

func formatRow(p demo.Progress) string {
	fill := "none"
	if p.Fill >= 0 {
		fill = fmt.Sprintf("%3.0f%% of %s", 100*p.Fill, short(float64(p.Budget)))
	}
	lag := "?"
	if p.Lag >= 0 {
		lag = fmt.Sprint(p.Lag)
	}
	return fmt.Sprintf("%-9s %5.1fs  %6d/%-7d  %10s  %-11s  %9s  %5s  %5d  %7d  %4d  %5d",
		p.Group, p.T.Seconds(), p.Accounted, p.Published, short(p.VerticesPerS), fill,
		short(float64(p.Inflight)), lag, p.Shed, p.Redeliveries, p.Duplicates, p.Evictions)
}
