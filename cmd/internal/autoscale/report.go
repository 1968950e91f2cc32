package autoscale

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// sent is one message the run published.
type sent struct {
	id       string
	at       time.Time
	vertices int
}

// done is one line a worker wrote: a message it finished.
type done struct {
	id  string
	at  time.Time
	pid int
}

// readDone reads every worker's file in dir.
func readDone(dir string) ([]done, error) {
	files, err := filepath.Glob(filepath.Join(dir, "worker-*.log"))
	if err != nil {
		return nil, err
	}
	var out []done
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		recs, err := parseDone(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("autoscale: %s: %w", name, err)
		}
		out = append(out, recs...)
	}
	return out, nil
}

// parseDone reads lines "<id> <produced ns> <done ns> <pid>"; a last line
// without its newline (a worker killed mid-write) is left out.
func parseDone(r io.Reader) ([]done, error) {
	var out []done
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		f := strings.Fields(line)
		if len(f) != 4 {
			return nil, fmt.Errorf("line %q: want id, produced, done, pid", strings.TrimSpace(line))
		}
		at, err1 := strconv.ParseInt(f[2], 10, 64)
		pid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("line %q: bad number", strings.TrimSpace(line))
		}
		out = append(out, done{id: f[0], at: time.Unix(0, at), pid: pid})
	}
}

// outcome is what the records say about a run.
type outcome struct {
	// LongestWait is the longest time from produce to the first finish of
	// any message; a lost message waited until end.
	LongestWait time.Duration
	// OverTarget is how long some message had waited longer than the
	// target (the union of those times), until end.
	OverTarget time.Duration
	// Duplicates are the messages finished more than once, Lost those
	// never finished.
	Duplicates, Lost int
	// finished is each message's first finish.
	finished map[string]time.Time
}

// analyse compares what was sent with what the workers finished, up to
// end.
func analyse(msgs []sent, recs []done, target time.Duration, end time.Time) outcome {
	o := outcome{finished: map[string]time.Time{}}
	count := map[string]int{}
	for _, r := range recs {
		count[r.id]++
		if f, ok := o.finished[r.id]; !ok || r.at.Before(f) {
			o.finished[r.id] = r.at
		}
	}
	var over [][2]time.Time
	for _, m := range msgs {
		fin, ok := o.finished[m.id]
		switch {
		case !ok:
			o.Lost++
			fin = end
		case count[m.id] > 1:
			o.Duplicates++
		}
		o.LongestWait = max(o.LongestWait, fin.Sub(m.at))
		if due := m.at.Add(target); fin.After(due) {
			over = append(over, [2]time.Time{due, fin})
		}
	}
	o.OverTarget = unionLength(over)
	return o
}

// unionLength is the total length the intervals cover.
func unionLength(iv [][2]time.Time) time.Duration {
	slices.SortFunc(iv, func(a, b [2]time.Time) int { return a[0].Compare(b[0]) })
	var total time.Duration
	var cur [2]time.Time
	for i, v := range iv {
		switch {
		case i == 0:
			cur = v
		case !v[0].After(cur[1]):
			if v[1].After(cur[1]) {
				cur[1] = v[1]
			}
		default:
			total += cur[1].Sub(cur[0])
			cur = v
		}
	}
	if len(iv) > 0 {
		total += cur[1].Sub(cur[0])
	}
	return total
}

// backlogAt is the vertices sent by t and not finished by t.
func backlogAt(msgs []sent, finished map[string]time.Time, t time.Time) int64 {
	var n int64
	for _, m := range msgs {
		if m.at.After(t) {
			continue
		}
		if f, ok := finished[m.id]; !ok || f.After(t) {
			n += int64(m.vertices)
		}
	}
	return n
}

// processesAt counts the spans (start, end in seconds) covering t.
func processesAt(spans [][2]float64, t float64) int {
	n := 0
	for _, s := range spans {
		if s[0] <= t && t < s[1] {
			n++
		}
	}
	return n
}

// WriteTable prints the report as a table.
func (rep *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "broker\tworkers\tcontroller\tmessages\tlongest wait s\tover target s\tprocess-s\tmax procs\tscale out/in\tduplicates\tlost\tbroker CPU s\t")
	for _, r := range rep.Runs {
		ctl := r.Controller
		if r.Threshold > 0 {
			ctl += fmt.Sprintf(" (%d msgs)", r.Threshold)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.1f\t%.1f\t%.0f\t%d\t%d/%d\t%d\t%d\t%.1f\t\n",
			r.Broker, r.Workers, ctl, r.Messages, r.LongestWait, r.OverTarget, r.ProcessSeconds,
			r.MaxProcesses, r.ScaleOuts, r.ScaleIns, r.Duplicates, r.Lost, r.BrokerCPU)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	o := rep.Options
	_, err := fmt.Fprintf(w, "\ntarget %s; %d-%d processes; a controller step every %s, scale-in stabilization %s; "+
		"handler: %s + %s per vertex, %d downstream slot(s) per process; budget %d vertices; Kafka %d partitions.\n"+
		"stream: %d messages, %d vertices; load average %.2f before, %.2f after.\n",
		o.Target, 1, o.MaxProcesses, o.Tick, o.ScaleDownWindow, o.Work.PerMessage, o.Work.PerVertex, o.Work.Slots,
		o.Budget, o.Partitions, rep.Stream.Messages, rep.Stream.Vertices, rep.LoadBefore, rep.LoadAfter)
	for _, s := range rep.Skipped {
		fmt.Fprintln(w, "skipped:", s)
	}
	return err
}
