package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/spillway-go/spillway/cmd/internal/autoscale"
)

// autoscaleOptions are the flags of "spillway bench autoscale".
type autoscaleOptions struct {
	o       autoscale.Options
	quick   bool
	runs    []string
	json    bool
	chart   string
	results string
	quiet   bool
	fixed   bool
}

func newAutoscaleCmd(e *env) *cobra.Command {
	def := autoscale.DefaultOptions()
	o := &autoscaleOptions{o: def}
	cmd := &cobra.Command{
		Use:   "autoscale [flags]",
		Short: "The fleet experiment: scale consumer processes on drain time or on message lag",
		Long: `autoscale runs real consumer processes (this executable, restarted as a
worker) in one consumer group on an embedded Kafka broker (kfake, in a child
process) and on a real redis-server (skipped, and said so, when it is not on
PATH), and adds and removes them with a controller that reads either

  drain-time        Spillway's drain time, scraped from the workers' Prometheus
                    metrics as docs/scaling.md's query reads it:
                    ceil(backlog seconds / target) processes
  message-lag       the consumer group's lag in messages, as KEDA's scalers read
                    it: ceil(lag / threshold), the threshold tuned to the
                    stream's average message (target x one process's rate)
  message-lag-low   the same, the threshold tuned to the boundaries (target x
                    one process's rate on them), low enough to meet the target

within 1 and --max-processes (Kafka: at most the partitions), scaling in no
lower than the highest answer of the last --scale-down-window. The stream is
seeded and bursty: bursts of 1-vertex pings alternate with bursts of real
country boundaries of thousands of vertices. The handler waits on a
downstream in proportion to a message's vertices.

For each broker it runs Spillway workers under each controller and plain
Watermill workers under message lag (--runs), and reports per run: the longest wait
of any message, the seconds during which some message had waited longer than
the target, process-seconds, scale events, duplicates (messages finished
more than once) and lost messages; a table (--json: JSON) and an SVG chart of
processes and backlog over time (--chart).

About seven minutes on two cores; --quick about half a minute.
docs/scaling.md ("The fleet experiment") summarises a full run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.quick {
				// The quick options, but what the flags set wins.
				q := autoscale.QuickOptions()
				f := cmd.Flags()
				for name, keep := range map[string]func(){
					"brokers":           func() { q.Brokers = o.o.Brokers },
					"target":            func() { q.Target = o.o.Target },
					"max-processes":     func() { q.MaxProcesses = o.o.MaxProcesses },
					"partitions":        func() { q.Partitions = o.o.Partitions },
					"scale-down-window": func() { q.ScaleDownWindow = o.o.ScaleDownWindow },
				} {
					if f.Changed(name) {
						keep()
					}
				}
				o.o = q
			}
			if cmd.Flags().Changed("runs") {
				o.o.Runs = nil
				for _, r := range o.runs {
					w, c, _ := strings.Cut(r, "/")
					o.o.Runs = append(o.o.Runs, autoscale.RunSpec{Workers: w, Controller: c})
				}
			}
			if o.fixed {
				o.o.SizeEvery = 0
			}
			return runAutoscale(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.quick, "quick", false, "a run of seconds: Kafka, Spillway workers under drain time and message lag, a short stream of cheap work")
	f.StringSliceVar(&o.runs, "runs", nil, "the runs, as workers/controller (default spillway/drain-time,spillway/message-lag,spillway/message-lag-low,plain/message-lag)")
	f.StringSliceVar(&o.o.Brokers, "brokers", def.Brokers, "brokers: kafka (embedded kfake), redis (a real redis-server)")
	f.DurationVar(&o.o.Target, "target", def.Target, "the drain-time target, and the wait the message-lag thresholds are tuned to")
	f.IntVar(&o.o.MaxProcesses, "max-processes", def.MaxProcesses, "the most worker processes (Kafka: also at most the partitions)")
	f.IntVar(&o.o.Partitions, "partitions", def.Partitions, "partitions of the Kafka topic")
	f.DurationVar(&o.o.ScaleDownWindow, "scale-down-window", def.ScaleDownWindow, "scale-in stabilization window")
	f.BoolVar(&o.fixed, "fixed-budget", false, "Spillway workers keep a fixed budget: their drain rate is then the vertices admitted in the last lag interval, not the auto-sizer's throughput")
	f.BoolVar(&o.json, "json", false, "print the report as JSON on stdout instead of the table")
	f.StringVar(&o.chart, "chart", "autoscale-chart.svg", `write the SVG chart here ("" for none)`)
	f.StringVar(&o.results, "results", "", "also write the JSON report to this file")
	f.BoolVar(&o.quiet, "quiet", false, "no progress lines on stderr")
	return cmd
}

func runAutoscale(ctx context.Context, e *env, o *autoscaleOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := o.o.Validate(); err != nil {
		return inputError{err}
	}
	outs, err := openReportFiles(o.chart, o.results)
	if err != nil {
		return err
	}
	defer outs.discard()
	if !o.quiet {
		start := time.Now()
		o.o.Progress = func(line string) {
			fmt.Fprintf(e.stderr, "[%3.0fs] %s\n", time.Since(start).Seconds(), line)
		}
	}
	redis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := autoscale.Run(ctx, o.o)
	if err != nil {
		return err
	}
	chart := rep.WriteChart
	if len(rep.Runs) == 0 {
		chart = nil // nothing ran: the chart file is left as it was
	}
	js, err := outs.write(chart, rep)
	if err != nil {
		return err
	}
	if o.json {
		_, err = e.stdout.Write(js)
		return err
	}
	return rep.WriteTable(e.stdout)
}
