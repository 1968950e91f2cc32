package scaling

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/spillway-go/spillway/cmd/internal/demo"
)

// WriteTable writes the report as plain-text tables: the machine, one row
// per consumer and cell, the checks, and the verdict line last.
func (rep *Report) WriteTable(w io.Writer) error {
	ew := &errWriter{w: w}
	m := rep.Machine
	fmt.Fprintf(ew, "spillway bench: scaling curve, %s/%s, %d CPUs (GOMAXPROCS %d), %s, started %s, took %s\n",
		m.GOOS, m.GOARCH, m.CPUs, m.GOMAXPROCS, m.Go, rep.Started.Format("2006-01-02 15:04 MST"), rep.Took)
	fmt.Fprintf(ew, "handler: decode + %s, 1 pass; backlog published before each run; CPU = this process's user+sys (getrusage) "+
		"over the window (from the last handler's first message to the last message; measured = messages in it), brokers in processes of their own; "+
		"peak heap = heap objects; ratio = Spillway / bare in the same cell\n",
		rep.Options.Work)
	for _, s := range rep.Skipped {
		fmt.Fprintf(ew, "skipped: %s\n", s)
	}
	fmt.Fprintln(ew)

	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "broker\tpar\thandlers\tcost\tconsumer\tbudget\tmeasured\tmsg/s\tvertices/s\tCPU µs/msg\tCPU ratio\tmsg/s ratio\tpeak heap\t")
	for _, r := range rep.Results {
		budget, ratio, tput := "-", "-", "-"
		if r.Consumer == ConsumerSpillway {
			budget = demo.Compact(float64(r.Budget))
			if r.CPURatio > 0 {
				ratio = fmt.Sprintf("%.2fx", r.CPURatio)
				tput = fmt.Sprintf("%.2fx", r.ThroughputRatio)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%.1f\t%s\t%s\t%s\t\n",
			r.Broker, r.Parallelism, r.Handlers, r.Cost, r.Consumer, budget, r.Messages,
			demo.Compact(r.MessagesPerSecond), demo.Compact(r.VerticesPerSecond), r.CPUPerMessage, ratio, tput, mib(r.PeakHeapBytes))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(rep.Checks) > 0 {
		fmt.Fprintf(ew, "\nchecks: the CPU ratio at an axis's smallest value against the highest ratio at a larger one; "+
			"growth above +%.0f%% fails unless Spillway's extra CPU per message rose by no more than the runs of one cell differ (noise)\n\n",
			100*rep.Options.Tolerance)
		tw = tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "axis\tbroker\tcost\tother settings\tfrom\tratio\tto\tratio\textra CPU rise µs\tnoise µs\tresult")
		for _, c := range rep.Checks {
			res := "ok"
			if rep.Options.Runs < MinJudgedRuns {
				res = "not judged"
			} else if c.Grew {
				res = "GROWS"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2fx\t%s\t%.2fx\t%+.1f\t%.1f\t%s\n", axisLabel(c.Axis, c.Broker), c.Broker, c.Cost, c.Fixed,
				strconv.FormatInt(c.From, 10), c.FromRatio, strconv.FormatInt(c.To, 10), c.ToRatio, c.Growth, c.Noise, res)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(ew, "\n%s\n", rep.Verdict)
	return ew.err
}

// mib writes b in MiB.
func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}
