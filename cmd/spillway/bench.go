package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/spillway-go/spillway/cmd/internal/scaling"
)

// benchOptions are the flags of "spillway bench".
type benchOptions struct {
	o       scaling.Options
	quick   bool
	json    bool
	md      bool
	chart   string
	results string
	strict  bool
	quiet   bool
	from    string
}

func newBenchCmd(e *env) *cobra.Command {
	def := scaling.DefaultOptions()
	o := &benchOptions{o: def}
	cmd := &cobra.Command{
		Use:   "bench [flags]",
		Short: "Measure how consuming scales: Spillway against the bare upstream subscriber",
		Long: `bench runs the scaling curve: on an embedded Kafka broker (kfake, in a child
process) and a real redis-server (skipped, and said so, when it is not on
PATH), it consumes a backlog of real geometry with the bare upstream subscriber
(watermill-kafka or watermill-redisstream under Watermill's router, with the
Spillway router's settings) and with the Spillway router, for every
combination of

  partitions per topic (Kafka) or consumers per topic (Redis)   --parallelism
  handlers, each on a topic of its own                           --handlers
  message cost: ping (1 vertex), polygon (a county), heavy       --costs
  Spillway's vertex budget                                       --budgets

and reports messages/s, vertices/s, CPU per message (this process's user+sys
time; the brokers run in processes of their own) and peak heap, as a table
(--json: JSON) and an SVG chart (--chart). It checks that Spillway's CPU per
message, as a ratio to the bare subscriber's in the same cell, does not grow
with parallelism, handlers or budget size, and ends with a verdict line
(--strict: exit 1 when it fails). A rise counts only beyond the spread
between the runs of one cell, so a sweep of one run (--quick) is not
judged: give --runs 2 or more for a verdict.

The full sweep (three runs of each consumer, medians) takes about half an
hour on two cores; --quick about two minutes.
docs/benchmarks.md ("Scaling curve") summarises a full run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.quick {
				q := scaling.QuickOptions()
				f := cmd.Flags()
				for name, apply := range map[string]func(){
					"brokers":        func() { o.o.Brokers = q.Brokers },
					"parallelism":    func() { o.o.Parallelism = q.Parallelism },
					"handlers":       func() { o.o.Handlers = q.Handlers },
					"costs":          func() { o.o.Costs = q.Costs },
					"budgets":        func() { o.o.Budgets = q.Budgets },
					"messages":       func() { o.o.Messages = q.Messages },
					"heavy-vertices": func() { o.o.HeavyVertices = q.HeavyVertices },
					"runs":           func() { o.o.Runs = q.Runs },
				} {
					if !f.Changed(name) {
						apply()
					}
				}
			}
			return runBench(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.quick, "quick", false, "a short sweep: parallelism 1,12, pings and heavy messages, one budget, 6,000 pings, one run, so no verdict (flags given explicitly still win: --quick --runs 2 judges)")
	f.StringSliceVar(&o.o.Brokers, "brokers", def.Brokers, "brokers: kafka (embedded kfake), redis (a real redis-server)")
	f.IntSliceVar(&o.o.Parallelism, "parallelism", def.Parallelism, "partitions per topic (Kafka) and consumers per topic (Redis)")
	f.IntSliceVar(&o.o.Handlers, "handlers", def.Handlers, "handlers, each consuming a topic of its own")
	f.StringSliceVar(&o.o.Costs, "costs", def.Costs, "message costs: ping, polygon, heavy")
	f.Int64SliceVar(&o.o.Budgets, "budgets", def.Budgets, "Spillway's vertex budgets (budget.vertices)")
	f.IntVar(&o.o.Messages, "messages", def.Messages, "pings per cell, split over the handlers; polygon cells have half as many messages, heavy cells a hundredth")
	f.IntVar(&o.o.HeavyVertices, "heavy-vertices", def.HeavyVertices, "vertices per heavy multipolygon (real polygons assembled)")
	f.StringVar(&o.o.Work, "work", def.Work, "the handler's work after decoding (noop, area-centroid, hull, full, crossings)")
	f.IntVar(&o.o.Runs, "runs", def.Runs, "runs of each consumer per cell, order alternating; the table shows medians")
	f.Float64Var(&o.o.Tolerance, "tolerance", def.Tolerance, "how much the CPU ratio may rise along an axis (a share of its value at the smallest setting) before the check fails")
	f.DurationVar(&o.o.RunTimeout, "run-timeout", def.RunTimeout, "the most one consumer run may take to consume its backlog")
	f.BoolVar(&o.json, "json", false, "print the report as JSON on stdout instead of the table")
	f.BoolVar(&o.md, "markdown", false, "print the table as Markdown (one row per cell) instead of plain text")
	f.StringVar(&o.chart, "chart", "scaling-chart.svg", `write the SVG chart here ("" for none)`)
	f.StringVar(&o.results, "results", "", "also write the JSON report to this file")
	f.BoolVar(&o.strict, "strict", false, "exit 1 when the verdict is FAIL")
	f.BoolVar(&o.quiet, "quiet", false, "no progress lines on stderr")
	f.StringVar(&o.from, "from", "", "run nothing: render the table (or --json), the chart and the verdict of a JSON report saved with --results")
	cmd.AddCommand(newAutoscaleCmd(e))
	return cmd
}

// errGrowth is returned under --strict when a check fails.
var errGrowth = errors.New("the CPU-per-message ratio grows (see the verdict)")

func runBench(ctx context.Context, e *env, o *benchOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := o.o.Validate(); err != nil {
		return inputError{err}
	}
	if o.json && o.md {
		return badInput("--json and --markdown: choose one")
	}
	// Fail on an unwritable output before the sweep rather than after.
	outs, err := openReportFiles(o.chart, o.results)
	if err != nil {
		return err
	}
	defer outs.discard()
	if !o.quiet {
		o.o.Progress = func(line string) { fmt.Fprintln(e.stderr, line) }
	}
	// go-redis logs connections closed under it as a router shuts down:
	// noise between the progress lines.
	redis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	var rep *scaling.Report
	if o.from != "" {
		b, err := os.ReadFile(o.from)
		if err != nil {
			return badInput("--from: %v", err)
		}
		rep = new(scaling.Report)
		if err := json.Unmarshal(b, rep); err != nil || len(rep.Results) == 0 {
			return badInput("--from: %s is not a report written by --results (%v)", o.from, err)
		}
	} else if rep, err = scaling.Run(ctx, o.o); errors.Is(err, scaling.ErrInvalid) {
		return inputError{err}
	} else if err != nil {
		return err
	}
	js, err := outs.write(rep.WriteChart, rep)
	if err != nil {
		return err
	}
	switch {
	case o.json:
		_, err = e.stdout.Write(js)
	case o.md:
		err = rep.WriteMarkdown(e.stdout)
	default:
		err = rep.WriteTable(e.stdout)
	}
	if err != nil {
		return err
	}
	if o.strict && !rep.Pass {
		return errGrowth
	}
	return nil
}

// quietRedis is a go-redis logger that drops everything.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// reportFiles are a bench command's --chart and --results outputs, each
// written to a temporary file first (pendingFile), so that an unwritable
// path fails before the measurement rather than after it.
type reportFiles struct{ chart, results *pendingFile }

// openReportFiles creates the pending outputs of the paths given ("" for
// none).
func openReportFiles(chart, results string) (*reportFiles, error) {
	var r reportFiles
	for _, out := range []struct {
		flag, path string
		p          **pendingFile
	}{{"--chart", chart, &r.chart}, {"--results", results, &r.results}} {
		if out.path == "" {
			continue
		}
		p, err := createPending(out.path)
		if err != nil {
			r.discard()
			return nil, badInput("%s: %v", out.flag, err)
		}
		*out.p = p
	}
	return &r, nil
}

// write writes the chart with writeChart (skipped when nil) and report as
// indented JSON to the files asked for, and returns the JSON.
func (r *reportFiles) write(writeChart func(io.Writer) error, report any) ([]byte, error) {
	if r.chart != nil && writeChart != nil {
		if err := writeChart(r.chart.f); err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		if err := r.chart.commit(); err != nil {
			return nil, err
		}
	}
	js, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return nil, err
	}
	js = append(js, '\n')
	if r.results != nil {
		if _, err := r.results.f.Write(js); err != nil {
			return nil, err
		}
		if err := r.results.commit(); err != nil {
			return nil, err
		}
	}
	return js, nil
}

// discard removes the outputs not written.
func (r *reportFiles) discard() {
	r.chart.discard()
	r.results.discard()
}
