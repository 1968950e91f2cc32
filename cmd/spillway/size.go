package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/refwork"
	"github.com/spillway-go/spillway/sizing"
)

// sizeOptions are the flags of "spillway size".
type sizeOptions struct {
	sample      string
	memory      byteSize
	deadline    time.Duration
	processes   int
	prefetch    byteSize
	handler     string
	heavyAbove  int
	chart       string
	json        bool
	headroom    float64
	tailShare   float64
	parallelism int
	repeats     int
	progress    bool
}

// Defaults of "spillway size". The deadline is Spillway's Redis Streams
// MaxIdleTime; Kafka's Rebalance.Timeout defaults to 60s.
const (
	defaultMemory     = 2 << 30
	defaultDeadline   = 30 * time.Second
	defaultHandler    = "full"
	defaultHeavyAbove = 1000
	defaultRepeats    = 5
)

func newSizeCmd(e *env) *cobra.Command {
	o := &sizeOptions{memory: defaultMemory}
	cmd := &cobra.Command{
		Use:   "size --sample FILE.ndjson [flags]",
		Short: "Compute a vertex budget from a sample of real payloads",
		Long: `size measures, on a sample of real payloads, the memory one in-flight vertex
takes (bytes per vertex) and how many vertices per second a handler processes
with the parallelism production uses, and computes the two bounds on a vertex
budget:

  memory bound   = (memory / processes - prefetch) / bytes per vertex
  deadline bound = vertices per second x deadline x headroom

The budget is the smaller one; the output names it. The sample is NDJSON, one
payload per line (GeoJSON Feature, Geometry or FeatureCollection, or hex
WKB/EWKB), ideally a contiguous window of the busiest hour.

The handlers are built-in stand-ins for your own (--handler); to size with
your real handler, call sizing.MeasureThroughput and sizing.Recommend from Go.

--chart writes an SVG of the budget each bound permits against the share of
heavy geometry (geometries with more than --heavy-above vertices), with the
throughput at each mix interpolated from the measured light and heavy rates.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSize(cmd.Context(), e, o, cmd.Flags().Changed("progress"))
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.sample, "sample", "", "NDJSON file of real payloads, one per line (required)")
	f.Var(&o.memory, "memory", "memory the container gives the consumers for in-flight geometry (e.g. 2GiB, 512Mi)")
	f.DurationVar(&o.deadline, "deadline", defaultDeadline, "the broker's redelivery deadline: Kafka Rebalance.Timeout, Redis MaxIdleTime")
	f.IntVar(&o.processes, "processes", 1, "consumer processes sharing --memory")
	f.Var(&o.prefetch, "prefetch", "bytes each process's broker client buffers ahead of the handlers")
	f.StringVar(&o.handler, "handler", defaultHandler, "reference handler: "+strings.Join(refwork.Names(), ", "))
	f.IntVar(&o.heavyAbove, "heavy-above", defaultHeavyAbove, "vertices above which a geometry counts as heavy (for --chart)")
	f.StringVar(&o.chart, "chart", "", "write an SVG chart of both bounds against the heavy share to this file")
	f.BoolVar(&o.json, "json", false, "print JSON instead of a table")
	f.Float64Var(&o.headroom, "headroom", defaultHeadroom, "share of the deadline a full budget may take to drain, in (0, 1]")
	f.Float64Var(&o.tailShare, "tail-share", defaultTailShare, "share of the deadline the sample's slowest messages (by cost per vertex) may take, in (0, 1]")
	f.IntVar(&o.parallelism, "parallelism", 0, "handlers running at once while measuring (default GOMAXPROCS)")
	f.IntVar(&o.repeats, "repeats", defaultRepeats, "measuring runs; the median counts")
	f.BoolVar(&o.progress, "progress", false, "show a progress bar even when stderr is not a terminal (--progress=false: never)")
	return cmd
}

// validate checks the flags before anything is read or measured.
func (o *sizeOptions) validate() error {
	switch {
	case o.sample == "":
		return badInput("--sample is required: an NDJSON file of real payloads")
	case o.memory <= 0:
		return badInput("--memory must be positive, got %d bytes", int64(o.memory))
	case o.deadline <= 0:
		return badInput("--deadline must be positive, got %v", o.deadline)
	case o.processes <= 0:
		return badInput("--processes must be positive, got %d", o.processes)
	case o.prefetch < 0:
		return badInput("--prefetch must not be negative, got %d bytes", int64(o.prefetch))
	case o.heavyAbove < 0:
		return badInput("--heavy-above must not be negative, got %d", o.heavyAbove)
	case !(o.headroom > 0 && o.headroom <= 1):
		return badInput("--headroom must be in (0, 1], got %v", o.headroom)
	case !(o.tailShare > 0 && o.tailShare <= 1):
		return badInput("--tail-share must be in (0, 1], got %v", o.tailShare)
	case o.parallelism < 0:
		return badInput("--parallelism must not be negative, got %d", o.parallelism)
	case o.repeats <= 0:
		return badInput("--repeats must be positive, got %d", o.repeats)
	}
	if _, err := refwork.ByName(o.handler); err != nil {
		return badInput("--handler %q is not a reference handler (have %s)", o.handler, strings.Join(refwork.Names(), ", "))
	}
	return nil
}

// sizeReport is the --json output. Field names are stable.
type sizeReport struct {
	Sample struct {
		File       string `json:"file"`
		Geometries int    `json:"geometries"`
		Vertices   int64  `json:"vertices"`
		Bytes      int64  `json:"bytes"`
	} `json:"sample"`
	Handler struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		Parallelism int    `json:"parallelism"`
		Repeats     int    `json:"repeats"`
	} `json:"handler"`
	Memory     memoryReport     `json:"memory"`
	Throughput throughputReport `json:"throughput"`
	Inputs     struct {
		MemoryBytes       int64   `json:"memory_bytes"`
		Processes         int     `json:"processes"`
		PrefetchBytes     int64   `json:"prefetch_bytes"`
		BytesPerVertex    float64 `json:"bytes_per_vertex"`
		VerticesPerSecond float64 `json:"vertices_per_second"`
		DeadlineSeconds   float64 `json:"deadline_seconds"`
		Headroom          float64 `json:"headroom"`
		Spread            float64 `json:"spread"`
		TailShare         float64 `json:"tail_share"`
	} `json:"inputs"`
	DrainShare          float64    `json:"drain_share"`
	SpreadLimited       bool       `json:"spread_limited"`
	GeometryMemoryBytes int64      `json:"geometry_memory_bytes"`
	MemoryBound         int64      `json:"memory_bound"`
	DeadlineBound       int64      `json:"deadline_bound"`
	Budget              int64      `json:"budget"`
	Binding             string     `json:"binding"`
	DrainSeconds        float64    `json:"drain_seconds"`
	SoloLimit           int64      `json:"solo_limit"`
	LargestMessage      int64      `json:"largest_message"`
	Warning             string     `json:"warning,omitempty"`
	Advice              string     `json:"advice"`
	Mix                 *mixReport `json:"mix,omitempty"`
}

// memoryReport is sizing.MemoryProfile with the sample it was measured on.
type memoryReport struct {
	Payloads          int     `json:"payloads"`
	Vertices          int64   `json:"vertices"`
	PayloadBytes      int64   `json:"payload_bytes"`
	PeakHeapBytes     int64   `json:"peak_heap_bytes"`
	RetainedHeapBytes int64   `json:"retained_heap_bytes"`
	RSSBytes          int64   `json:"rss_bytes"`
	BytesPerVertex    float64 `json:"bytes_per_vertex"`
	// Source says which measurement BytesPerVertex came from, the larger
	// one: "heap" or "rss".
	Source string `json:"source"`
}

func newMemoryReport(s *sizing.Sample, m sizing.MemoryProfile) memoryReport {
	vertices, size := sampleTotals(s)
	r := memoryReport{
		Payloads:          len(s.Payloads),
		Vertices:          vertices,
		PayloadBytes:      size,
		PeakHeapBytes:     m.PeakHeapBytes,
		RetainedHeapBytes: m.RetainedHeapBytes,
		RSSBytes:          m.RSSBytes,
		BytesPerVertex:    m.BytesPerVertex,
		Source:            "heap",
	}
	if m.RSSBytes > m.PeakHeapBytes {
		r.Source = "rss"
	}
	return r
}

// throughputReport is what sizing.MeasureThroughput measured over every
// run, with how it was measured.
type throughputReport struct {
	// VerticesPerSecond is the median of Runs.
	VerticesPerSecond float64 `json:"vertices_per_second"`
	// Runs holds each repeat's rate, in the order they ran.
	Runs        []float64 `json:"runs"`
	Parallelism int       `json:"parallelism"`
	// Payloads and Vertices are processed per run.
	Payloads int     `json:"payloads"`
	Vertices int64   `json:"vertices"`
	Spread   float64 `json:"spread"`
}

// sampleTotals returns the vertices and bytes of s's payloads.
func sampleTotals(s *sizing.Sample) (vertices, size int64) {
	for i, p := range s.Payloads {
		vertices += int64(s.Vertices[i])
		size += int64(len(p))
	}
	return vertices, size
}

// splitSample divides s into the payloads with at most heavyAbove vertices
// (light) and those with more (heavy). Either part is nil when it would be
// empty. The payloads are shared, not copied.
func splitSample(s *sizing.Sample, heavyAbove int) (light, heavy *sizing.Sample) {
	add := func(part **sizing.Sample, i int) {
		if *part == nil {
			*part = &sizing.Sample{}
		}
		(*part).Payloads = append((*part).Payloads, s.Payloads[i])
		(*part).Vertices = append((*part).Vertices, s.Vertices[i])
	}
	for i, n := range s.Vertices {
		if n > heavyAbove {
			add(&heavy, i)
		} else {
			add(&light, i)
		}
	}
	return light, heavy
}

// mixReport describes the chart (present with --chart only).
type mixReport struct {
	Chart                  string   `json:"chart"`
	HeavyAbove             int      `json:"heavy_above"`
	HeavyShare             float64  `json:"heavy_share"`
	LightGeometries        int      `json:"light_geometries"`
	HeavyGeometries        int      `json:"heavy_geometries"`
	LightVerticesPerSecond float64  `json:"light_vertices_per_second"`
	HeavyVerticesPerSecond float64  `json:"heavy_vertices_per_second"`
	Crossover              crossing `json:"crossover"`
}

// crossing is where the two bounds meet on the chart. When they do not
// cross between 0 and 100 % heavy, Crosses is false and the rest is 0.
type crossing struct {
	Crosses    bool    `json:"crosses"`
	HeavyShare float64 `json:"heavy_share"`
	Budget     int64   `json:"budget"`
}

func runSize(ctx context.Context, e *env, o *sizeOptions, progressSet bool) error {
	if err := o.validate(); err != nil {
		return err
	}
	fn, _ := refwork.ByName(o.handler)
	sample, err := readSampleFile(o.sample)
	if err != nil {
		return err
	}
	par := o.parallelism
	if par == 0 {
		par = runtime.GOMAXPROCS(0)
	}

	var (
		light, heavy *sizing.Sample
		out          *pendingFile
	)
	if o.chart != "" {
		light, heavy = splitSample(sample, o.heavyAbove)
		if heavy == nil {
			return badInput("--heavy-above %d: no geometry in the sample has more vertices (the largest has %d); the chart needs both classes",
				o.heavyAbove, maxInt(sample.Vertices))
		}
		if light == nil {
			return badInput("--heavy-above %d: every geometry in the sample has more vertices (the smallest has %d); the chart needs both classes",
				o.heavyAbove, minInt(sample.Vertices))
		}
		// Fail on an unwritable path now, not after measuring.
		if out, err = createPending(o.chart); err != nil {
			return badInput("--chart: %v", err)
		}
		defer out.discard()
	}

	// One bar over every run: the whole sample, then (for the chart) its
	// light and heavy parts, which add up to the whole sample again.
	sampleVertices, _ := sampleTotals(sample)
	total := sampleVertices * int64(o.repeats)
	if o.chart != "" {
		total *= 2
	}
	showBar := e.stderrTTY
	if progressSet {
		showBar = o.progress
	}
	bar := newProgress(e.stderr, showBar, total, "measuring "+o.handler)
	defer bar.stop()

	handler := func(_ context.Context, p []byte) error {
		_, err := refwork.Process(fn, p, 1)
		return err
	}

	mem, err := sizing.MeasureBytesPerVertex(sample)
	if err != nil {
		return fmt.Errorf("measuring memory: %w", err)
	}
	samples := []*sizing.Sample{sample}
	if o.chart != "" {
		samples = append(samples, light, heavy)
	}
	rates, err := measureInterleaved(ctx, samples, handler, par, o.repeats, bar)
	if err != nil {
		return err
	}
	tp := rates[0]
	in := sizing.Inputs{
		MemoryBytes:       int64(o.memory),
		Processes:         o.processes,
		PrefetchBytes:     int64(o.prefetch),
		BytesPerVertex:    mem.BytesPerVertex,
		VerticesPerSecond: tp.VerticesPerSecond,
		Deadline:          o.deadline,
		Headroom:          o.headroom,
		Spread:            tp.Spread,
		TailShare:         o.tailShare,
		Parallelism:       par,
	}
	rec, err := recommend(in, largestMessage(sample))
	if err != nil {
		if errors.Is(err, spillway.ErrInvalidConfig) || errors.Is(err, sizing.ErrInfeasible) {
			return inputError{err}
		}
		return err
	}

	r := newSizeReport(o, sample, mem, tp, in, rec, par)
	if o.chart != "" {
		c := newChartData(o, in, rec, light, heavy, rates[1].VerticesPerSecond, rates[2].VerticesPerSecond)
		if err := c.render(out.f); err != nil {
			return fmt.Errorf("drawing chart: %w", err)
		}
		if err := out.commit(); err != nil {
			return fmt.Errorf("writing chart: %w", err)
		}
		r.Mix = c.report(o.chart)
	}
	bar.stop()

	if o.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	printHuman(e.stdout, r)
	return nil
}

// measureInterleaved measures the throughput of each sample repeats times,
// taking turns (round 1: every sample once, round 2: ...), so a burst of
// load on a shared machine slows every sample's runs alike and the ratios
// between them hold. Each result's rate is the median of its runs.
func measureInterleaved(ctx context.Context, samples []*sizing.Sample, handler func(context.Context, []byte) error,
	par, repeats int, bar *progress) ([]throughputReport, error) {
	out := make([]throughputReport, len(samples))
	spreads := make([][]float64, len(samples))
	for i, s := range samples {
		out[i].Parallelism, out[i].Payloads = par, len(s.Payloads)
		out[i].Vertices, _ = sampleTotals(s)
	}
	var base int64
	for range repeats {
		for i, s := range samples {
			vps, spread, err := sizing.MeasureThroughput(ctx, s, handler,
				sizing.WithParallelism(par), sizing.WithRepeats(1), sizing.WithProgress(bar.offset(base)))
			if err != nil {
				return nil, fmt.Errorf("measuring throughput: %w", err)
			}
			base += out[i].Vertices
			out[i].Runs = append(out[i].Runs, vps)
			spreads[i] = append(spreads[i], spread)
		}
	}
	for i := range out {
		out[i].VerticesPerSecond = median(out[i].Runs)
		out[i].Spread = median(spreads[i])
	}
	return out, nil
}

// median returns the median of xs without reordering it.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// readSampleFile reads and checks the sample; every problem is bad input.
func readSampleFile(path string) (*sizing.Sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, inputError{err}
	}
	defer f.Close()
	s, err := sizing.ReadSample(f)
	if err != nil {
		// The error names the line, or says the sample is empty.
		return nil, badInput("%s: %v", path, strings.TrimPrefix(err.Error(), "sizing: "))
	}
	return s, nil
}

// newSizeReport builds the report; in are the inputs rec was computed from
// (every default is explicit in the flags).
func newSizeReport(o *sizeOptions, s *sizing.Sample, mem sizing.MemoryProfile, tp throughputReport, in sizing.Inputs, rec recommendation, par int) *sizeReport {
	r := &sizeReport{Memory: newMemoryReport(s, mem), Throughput: tp}
	r.Sample.File = o.sample
	r.Sample.Geometries = len(s.Payloads)
	r.Sample.Vertices, r.Sample.Bytes = sampleTotals(s)
	r.Handler.Name = o.handler
	r.Handler.Description = refwork.Descriptions[o.handler]
	r.Handler.Parallelism = par
	r.Handler.Repeats = o.repeats
	r.Inputs.MemoryBytes = in.MemoryBytes
	r.Inputs.Processes = in.Processes
	r.Inputs.PrefetchBytes = in.PrefetchBytes
	r.Inputs.BytesPerVertex = in.BytesPerVertex
	r.Inputs.VerticesPerSecond = in.VerticesPerSecond
	r.Inputs.DeadlineSeconds = in.Deadline.Seconds()
	r.Inputs.Headroom = in.Headroom
	r.Inputs.Spread = in.Spread
	r.Inputs.TailShare = in.TailShare
	r.DrainShare = rec.drainShare
	r.SpreadLimited = rec.spreadLimited
	r.GeometryMemoryBytes = in.MemoryBytes/int64(in.Processes) - in.PrefetchBytes
	r.MemoryBound = rec.MemoryBound
	r.DeadlineBound = rec.DeadlineBound
	r.Budget = rec.Budget
	r.Binding = rec.Binding
	r.DrainSeconds = rec.drainTime.Seconds()
	r.Advice = rec.advice
	r.SoloLimit, r.LargestMessage, r.Warning = rec.SoloLimit, largestMessage(s), rec.warning
	return r
}

// largestMessage is the vertices of the sample's largest payload.
func largestMessage(s *sizing.Sample) int64 {
	var n int
	for _, v := range s.Vertices {
		n = max(n, v)
	}
	return int64(n)
}

// printHuman prints the report as an aligned table.
func printHuman(w io.Writer, r *sizeReport) {
	mem, tp := r.Memory, r.Throughput
	var buf bytes.Buffer
	defer func(out io.Writer) {
		// The blank rows of the table come out padded; trim them.
		for line := range strings.Lines(buf.String()) {
			fmt.Fprintln(out, strings.TrimRight(line, " \n"))
		}
	}(w)
	w = &buf
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, args...)...) }
	plural := func(n int, one, many string) string {
		if n == 1 {
			return one
		}
		return many
	}
	row("sample", "%s: %s geometries, %s vertices, %s", r.Sample.File, group(int64(r.Sample.Geometries)),
		group(r.Sample.Vertices), formatBytes(r.Sample.Bytes))
	row("handler", "%s (%s), %d at once, median of %d runs", r.Handler.Name, r.Handler.Description,
		r.Handler.Parallelism, r.Handler.Repeats)
	row("", "")
	row("bytes per vertex", "%.0f  (peak heap %s, RSS +%s: the larger counts)", mem.BytesPerVertex,
		formatBytes(mem.PeakHeapBytes), formatBytes(mem.RSSBytes))
	runs := make([]string, len(tp.Runs))
	for i, v := range tp.Runs {
		runs[i] = group(int64(v))
	}
	row("vertices per second", "%s  (runs: %s)", group(int64(tp.VerticesPerSecond)), strings.Join(runs, ", "))
	row("memory", "%s / %d %s - %s prefetch = %s per process for geometry", formatBytes(r.Inputs.MemoryBytes),
		r.Inputs.Processes, plural(r.Inputs.Processes, "process", "processes"), formatBytes(r.Inputs.PrefetchBytes),
		formatBytes(r.GeometryMemoryBytes))
	row("spread", "%.2f  (the slowest 5 %% of the vertices cost this many times the mean or more)", r.Inputs.Spread)
	if r.SpreadLimited {
		row("deadline", "%v x %.2g  (tail share %.2g / spread %.2f, below the %.2g headroom)",
			time.Duration(r.Inputs.DeadlineSeconds*float64(time.Second)), r.DrainShare, r.Inputs.TailShare, r.Inputs.Spread, r.Inputs.Headroom)
	} else {
		row("deadline", "%v x %.2g headroom", time.Duration(r.Inputs.DeadlineSeconds*float64(time.Second)), r.Inputs.Headroom)
	}
	row("", "")
	mark := func(b string) string {
		if r.Binding == b {
			return "  <- binds"
		}
		return ""
	}
	row("memory bound", "%s vertices%s", group(r.MemoryBound), mark("memory"))
	row("deadline bound", "%s vertices%s", group(r.DeadlineBound), mark("deadline"))
	row("budget", "%s vertices  (a full budget drains in %v)", group(r.Budget),
		time.Duration(r.DrainSeconds*float64(time.Second)).Round(time.Millisecond))
	row("solo limit", "%s vertices  (the largest message one core finishes in the deadline's headroom; the sample's largest: %s)",
		group(r.SoloLimit), group(r.LargestMessage))
	tw.Flush()
	fmt.Fprintf(w, "\n%s.\n", upperFirst(r.Advice))
	if r.Warning != "" {
		fmt.Fprintf(w, "Warning: %s.\n", r.Warning)
	}
	if r.Mix != nil {
		fmt.Fprintf(w, "Chart: %s (light %s vertices/s, heavy %s vertices/s above %d vertices; ",
			r.Mix.Chart, group(int64(r.Mix.LightVerticesPerSecond)), group(int64(r.Mix.HeavyVerticesPerSecond)), r.Mix.HeavyAbove)
		if r.Mix.Crossover.Crosses {
			fmt.Fprintf(w, "the bounds cross at %.0f %% heavy).\n", r.Mix.Crossover.HeavyShare*100)
		} else {
			fmt.Fprintf(w, "the bounds do not cross).\n")
		}
	}
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func maxInt(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func minInt(xs []int) int {
	if len(xs) == 0 {
		return 0
	}
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

// pendingFile is an output written to a temporary file next to its
// destination and renamed over it only when complete, so an error never
// leaves a partial file behind.
type pendingFile struct {
	f    *os.File
	dest string
	done bool
}

func createPending(dest string) (*pendingFile, error) {
	dir := "."
	if i := strings.LastIndexAny(dest, `/\`); i >= 0 {
		dir = dest[:i+1]
	}
	f, err := os.CreateTemp(dir, ".spillway-*.tmp")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the temporary name means nothing to the user
		}
		return nil, fmt.Errorf("cannot write %s: %w", dest, err)
	}
	return &pendingFile{f: f, dest: dest}, nil
}

func (p *pendingFile) commit() error {
	if err := p.f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(p.f.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(p.f.Name(), p.dest); err != nil {
		return err
	}
	p.done = true
	return nil
}

// discard removes the temporary file unless it was committed.
func (p *pendingFile) discard() {
	if p == nil || p.done {
		return
	}
	p.f.Close()
	os.Remove(p.f.Name())
}
