package demo

import (
	"fmt"
	"html/template"
	"image/color"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/spillway-go/spillway/cmd/internal/plotstyle"
)

// Chart is one chart of the report: an inline SVG and what it shows.
type Chart struct {
	ID      string
	Title   string
	Caption string
	SVG     template.HTML
}

// ChartTitles are the titles of the report's charts, in order.
var ChartTitles = []string{
	"In-flight vertices against the budget and the memory bound",
	"Per-message latency, p50 and p99 per second",
	"Consumer lag",
	"Retries, redeliveries, duplicates, evictions and shed messages",
	"Live heap",
}

var (
	groupColor = map[string]color.Color{
		GroupNaive:       color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		GroupSpillway:    color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		GroupSingleLane:  color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
		GroupSpillwayKey: color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	}
	budgetLineColor = color.NRGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0x90}
	boundColor      = color.RGBA{R: 0x33, G: 0x33, B: 0x33, A: 0xff}
	eventColor      = color.RGBA{R: 0x88, G: 0x88, B: 0x88, A: 0xff}
)

func colorOf(group string) color.Color {
	if c, ok := groupColor[group]; ok {
		return c
	}
	return color.Black
}

// Charts draws the report's charts from the recording.
func (r *Recording) Charts() ([]Chart, error) {
	draws := []func() (*plot.Plot, string, error){
		r.inflightChart, r.latencyChart, r.lagChart, r.countsChart, r.heapChart,
	}
	ids := []string{"inflight", "latency", "lag", "counts", "heap"}
	var out []Chart
	for i, d := range draws {
		p, caption, err := d()
		if err != nil {
			return nil, fmt.Errorf("demo: chart %q: %w", ChartTitles[i], err)
		}
		p.Title.Text = ChartTitles[i]
		svg, err := renderSVG(p, ids[i], ChartTitles[i])
		if err != nil {
			return nil, fmt.Errorf("demo: chart %q: %w", ChartTitles[i], err)
		}
		out = append(out, Chart{ID: ids[i], Title: ChartTitles[i], Caption: caption, SVG: template.HTML(svg)})
	}
	return out, nil
}

func newPlot() *plot.Plot {
	p := plotstyle.New()
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Legend.Padding = vg.Points(2)
	p.Legend.YOffs = -vg.Points(14) // below the event labels
	return p
}

// timeAxis labels the x axis and marks the burst and the join.
func (r *Recording) timeAxis(p *plot.Plot, top float64) error {
	bottom := p.Y.Min
	p.X.Label.Text = "seconds since production started"
	p.X.Min, p.X.Max = 0, r.endTime()
	p.X.Tick.Marker = plotstyle.RoundTicks(Compact)
	marks := []struct {
		t     float64
		label string
		right bool // label on the left of the line
	}{
		{r.Options.BurstAt.Seconds(), "burst ", true},
		{(r.Options.BurstAt + r.Options.JoinAfter).Seconds(), " 2nd consumer joins", false},
		{r.Options.Duration.Seconds(), " production ends", false},
	}
	var labels plotter.XYLabels
	for _, m := range marks {
		l, err := plotter.NewLine(plotter.XYs{{X: m.t, Y: bottom}, {X: m.t, Y: top}})
		if err != nil {
			return err
		}
		l.Color, l.Dashes, l.Width = eventColor, []vg.Length{vg.Points(2), vg.Points(3)}, vg.Points(1)
		p.Add(l)
		labels.XYs = append(labels.XYs, plotter.XY{X: m.t, Y: top})
		labels.Labels = append(labels.Labels, m.label)
	}
	lbl, err := plotter.NewLabels(labels)
	if err != nil {
		return err
	}
	for i := range lbl.TextStyle {
		lbl.TextStyle[i].Font.Size = vg.Points(8)
		lbl.TextStyle[i].Color = eventColor
		lbl.TextStyle[i].YAlign = draw.YTop
		if marks[i].right {
			lbl.TextStyle[i].XAlign = draw.XRight
		}
	}
	p.Add(lbl)
	// Adding plotters widens the axes to their data; pin them.
	p.Y.Min, p.Y.Max = bottom, top
	return nil
}

// endTime is the time axis' end: the longest group run, rounded up.
func (r *Recording) endTime() float64 {
	end := r.Options.Duration.Seconds()
	for _, g := range r.Groups {
		end = max(end, g.Ended)
	}
	return math.Ceil(end)
}

func addLine(p *plot.Plot, xys plotter.XYs, c color.Color, width float64, dashes []vg.Length, legend string) error {
	if len(xys) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.Color, l.Width, l.Dashes = c, vg.Points(width), dashes
	p.Add(l)
	if legend != "" {
		p.Legend.Add(legend, l)
	}
	return nil
}

func (r *Recording) inflightChart() (*plot.Plot, string, error) {
	p := newPlot()
	p.Y.Label.Text = "vertices in handlers"
	p.Y.Tick.Marker = plotstyle.RoundTicks(Compact)
	top := float64(r.Calibration.MemoryBound)
	for _, g := range r.Groups {
		var in, bud plotter.XYs
		for _, s := range g.Series {
			in = append(in, plotter.XY{X: s.T, Y: float64(s.Inflight)})
			if s.Budget > 0 {
				bud = append(bud, plotter.XY{X: s.T, Y: float64(s.Budget)})
			}
			top = max(top, float64(s.Inflight), float64(s.Budget))
		}
		if err := addLine(p, in, colorOf(g.Name), 1.5, nil, g.Name+": in flight"); err != nil {
			return nil, "", err
		}
		if err := addLine(p, bud, budgetLineColor, 2.5, []vg.Length{vg.Points(6), vg.Points(3)}, g.Name+": budget"); err != nil {
			return nil, "", err
		}
	}
	top *= 1.15
	mb := float64(r.Calibration.MemoryBound)
	if err := addLine(p, plotter.XYs{{X: 0, Y: mb}, {X: r.endTime(), Y: mb}}, boundColor, 1, []vg.Length{vg.Points(1), vg.Points(2)},
		fmt.Sprintf("memory bound (%s at %.0f B/vertex)", formatMiB(r.Calibration.MemoryBytes), r.Calibration.BytesPerVertex)); err != nil {
		return nil, "", err
	}
	p.Y.Min, p.Y.Max = 0, top
	if err := r.timeAxis(p, top); err != nil {
		return nil, "", err
	}
	caption := fmt.Sprintf("Vertices of the messages whose handlers are running, sampled every %s. The plain consumer runs whatever "+
		"its partitions deliver (one message per partition, %d partitions per topic); Spillway admits work against a vertex budget "+
		"sized to drain in half the %s redelivery deadline, then auto-sized online. The budget line is the sum over the members "+
		"(it doubles when the second consumer joins).", r.Options.SampleEvery, r.Options.Partitions, r.Options.Deadline)
	return p, caption, nil
}

// latencyWindows returns p50 and p99 of the latencies of messages
// completed in each window of width seconds.
func latencyWindows(g *GroupRecording, width float64) (p50, p99 plotter.XYs) {
	byWin := map[int][]float64{}
	for _, l := range g.Latencies {
		w := int(l.T / width)
		byWin[w] = append(byWin[w], max(l.Seconds, 0.001))
	}
	wins := make([]int, 0, len(byWin))
	for w := range byWin {
		wins = append(wins, w)
	}
	sort.Ints(wins)
	for _, w := range wins {
		x := (float64(w) + 0.5) * width
		p50 = append(p50, plotter.XY{X: x, Y: quantile(byWin[w], 0.5)})
		p99 = append(p99, plotter.XY{X: x, Y: quantile(byWin[w], 0.99)})
	}
	return p50, p99
}

func (r *Recording) latencyChart() (*plot.Plot, string, error) {
	p := newPlot()
	// Seconds on a log scale, drawn as log10 on a linear axis with
	// labelled decades (gonum centres a log axis' label oddly).
	p.Y.Label.Text = "publish to done (log scale)"
	p.Y.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		var ticks []plot.Tick
		for e := math.Ceil(lo); e <= hi; e++ {
			label := fmt.Sprintf("%gs", math.Pow(10, e))
			if e < 0 {
				label = fmt.Sprintf("%gms", math.Pow(10, e+3))
			}
			ticks = append(ticks, plot.Tick{Value: e, Label: label})
			for m := 2.0; m < 10 && e+math.Log10(m) <= hi; m++ {
				ticks = append(ticks, plot.Tick{Value: e + math.Log10(m)})
			}
		}
		return ticks
	})
	log := func(xys plotter.XYs) plotter.XYs {
		for i := range xys {
			xys[i].Y = math.Log10(xys[i].Y)
		}
		return xys
	}
	top := 1.0
	for _, g := range r.Groups {
		p50, p99 := latencyWindows(g, 1)
		for _, xy := range p99 {
			top = max(top, xy.Y)
		}
		if err := addLine(p, log(p50), colorOf(g.Name), 1, []vg.Length{vg.Points(4), vg.Points(2)}, g.Name+": p50"); err != nil {
			return nil, "", err
		}
		if err := addLine(p, log(p99), colorOf(g.Name), 2, nil, g.Name+": p99"); err != nil {
			return nil, "", err
		}
	}
	p.Y.Min = -3
	if err := r.timeAxis(p, math.Ceil(math.Log10(top))+0.3); err != nil {
		return nil, "", err
	}
	caption := "Time from publication to the end of the handler, for the messages completed in each second (all topics; " +
		"1 ms and below drawn at 1 ms). Messages never completed are not in this chart; the summary's latencies count them " +
		"with their age at the end of the run."
	return p, caption, nil
}

func (r *Recording) lagChart() (*plot.Plot, string, error) {
	p := newPlot()
	p.Y.Label.Text = "messages not yet committed"
	p.Y.Tick.Marker = plotstyle.RoundTicks(Compact)
	top := 10.0
	for _, g := range r.Groups {
		var xys plotter.XYs
		for _, s := range g.Series {
			if s.Lag >= 0 {
				xys = append(xys, plotter.XY{X: s.T, Y: float64(s.Lag)})
				top = max(top, float64(s.Lag))
			}
		}
		if err := addLine(p, xys, colorOf(g.Name), 1.5, nil, g.Name); err != nil {
			return nil, "", err
		}
	}
	top *= 1.15
	p.Y.Min, p.Y.Max = 0, top
	if err := r.timeAxis(p, top); err != nil {
		return nil, "", err
	}
	caption := fmt.Sprintf("Consumer lag summed over the group's topics (high-water mark minus committed offset, read through "+
		"Sarama's cluster admin every %s). Offsets are committed every second, so the line trails completions.", r.Options.LagEvery)
	return p, caption, nil
}

func (r *Recording) countsChart() (*plot.Plot, string, error) {
	p := newPlot()
	p.Y.Label.Text = "messages (evictions: members)"
	cats := []string{"retries after a failure", "redeliveries", "duplicates", "evictions", "shed"}
	p.NominalX(cats...)
	p.Legend.Left = true
	w := vg.Points(18)
	top := 1.0
	n := len(r.Groups)
	for i, g := range r.Groups {
		vals := plotter.Values{float64(g.Retries), float64(g.Redeliveries), float64(g.Duplicates), float64(g.Evictions), float64(g.Shed)}
		for _, v := range vals {
			top = max(top, v)
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, "", err
		}
		b.Color = colorOf(g.Name)
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(b)
		p.Legend.Add(g.Name, b)
		var labels plotter.XYLabels
		for j, v := range vals {
			labels.XYs = append(labels.XYs, plotter.XY{X: float64(j), Y: v})
			labels.Labels = append(labels.Labels, fmt.Sprint(v))
		}
		lbl, err := plotter.NewLabels(labels)
		if err != nil {
			return nil, "", err
		}
		for k := range lbl.TextStyle {
			lbl.TextStyle[k].Font.Size = vg.Points(8)
			lbl.TextStyle[k].XAlign = draw.XCenter
			lbl.TextStyle[k].YAlign = draw.YBottom
		}
		lbl.Offset = vg.Point{X: b.Offset, Y: vg.Points(2)}
		p.Add(lbl)
	}
	p.Y.Min, p.Y.Max = 0, top*1.35
	p.X.Min, p.X.Max = -0.6, float64(len(cats))-0.4
	caption := "Retries: second runs of the messages whose first attempt failed on purpose (a simulated downstream blip, the same " +
		"messages for both groups): watermill-kafka resends a nacked message, Spillway's retry gate retries or defers it. " +
		"Redeliveries: any other run of a message after its first, after a rebalance handed it to another member or an ack was " +
		"lost. Duplicates: messages whose work completed more than once. Evictions: members that came back from a rebalance " +
		"under a new member id. Shed: positions dropped on purpose by Spillway's policy (stale versions, low priority under " +
		"sustained pressure)."
	return p, caption, nil
}

func (r *Recording) heapChart() (*plot.Plot, string, error) {
	p := newPlot()
	p.Y.Label.Text = "MiB"
	top := 1.0
	for _, g := range r.Groups {
		var xys plotter.XYs
		peak := 0.0
		for _, s := range g.Series {
			v := float64(s.Heap) / (1 << 20)
			xys = append(xys, plotter.XY{X: s.T, Y: v})
			peak = max(peak, v)
		}
		top = max(top, peak)
		if err := addLine(p, xys, colorOf(g.Name), 1.5, nil, fmt.Sprintf("%s (peak %.0f MiB)", g.Name, peak)); err != nil {
			return nil, "", err
		}
	}
	top *= 1.15
	p.Y.Min, p.Y.Max = 0, top
	if err := r.timeAxis(p, top); err != nil {
		return nil, "", err
	}
	caption := "Live heap objects of the whole demo process (runtime/metrics /memory/classes/heap/objects:bytes): both " +
		"consumers, their Kafka clients' prefetch buffers and the embedded broker, which keeps every record in memory. " +
		"The groups run one after the other, with a collection in between."
	return p, caption, nil
}

// renderSVG draws p as an SVG element ready to be inlined in HTML.
func renderSVG(p *plot.Plot, id, title string) (string, error) {
	b, err := plotstyle.SVG(p, 10*vg.Inch, 4.6*vg.Inch, vg.Points(10))
	if err != nil {
		return "", err
	}
	svg := string(b)
	i := strings.Index(svg, "<svg")
	if i < 0 {
		return "", fmt.Errorf("no <svg> element in the output")
	}
	svg = svg[i:]
	// Name the chart, and let the page scale it.
	svg = strings.Replace(svg, "<svg ", fmt.Sprintf(`<svg class="chart" id="svg-%s" role="img" aria-label="%s" `,
		id, template.HTMLEscapeString(title)), 1)
	return svg, nil
}

func formatMiB(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// reportData is what the HTML template renders.
type reportData struct {
	Title     string
	Generated string
	S         Summary
	R         *Recording
	Table     [][]string
	Charts    []Chart
	Verdicts  []string
	Setup     [][2]string
	Events    []eventRow
}

type eventRow struct {
	Group string
	T     string
	What  string
}

// WriteReport writes the recording as a self-contained HTML page: the
// summary table, the setup, five SVG charts and the timeline. It loads
// nothing from anywhere: styles and charts are inline.
func WriteReport(w io.Writer, r *Recording) error {
	charts, err := r.Charts()
	if err != nil {
		return err
	}
	s := r.Summarize()
	d := reportData{
		Title:     "Spillway demo: a message-count consumer and a Spillway consumer on the same stream",
		Generated: r.Started.UTC().Format(time.RFC3339),
		S:         s,
		R:         r,
		Table:     s.Table(),
		Charts:    charts,
	}
	for _, g := range s.Groups {
		d.Verdicts = append(d.Verdicts, g.Verdict(r.Options.Deadline))
	}
	c := r.Calibration
	o := r.Options
	d.Setup = [][2]string{
		{"machine", fmt.Sprintf("%s/%s, %d CPUs (GOMAXPROCS %d), %s%s", r.Machine.GOOS, r.Machine.GOARCH, r.Machine.CPUs,
			r.Machine.GOMAXPROCS, r.Machine.Go, map[bool]string{true: ", race detector on", false: ""}[r.Machine.Race])},
		{"broker", brokerLine(o)},
		{"stream", fmt.Sprintf("%d messages over %s: %d pings from %d vehicles (%s), %d parcels (%s), a burst of %d heavy multipolygons "+
			"of ~%s vertices at %s; %.0f %% of first attempts fail", r.Stream.Messages, o.Duration, r.Stream.Pings, o.Vehicles,
			TopicPositions, r.Stream.Parcels, TopicBoundaries, r.Stream.Heavies, Compact(float64(o.HeavyVertices)), o.BurstAt, 100*o.FailRate)},
		{"handler", fmt.Sprintf("decode, then area, centroid and convex hull %d times: one heavy message takes %.2fs alone on one core",
			c.Passes, c.HeavySeconds)},
		{"redelivery deadline", deadlineLine(o)},
		{"calibration", fmt.Sprintf("%s vertices/s on %d cores, %.0f bytes per in-flight vertex; deadline bound %s, memory bound %s "+
			"(%s for in-flight geometry): Spillway starts at %s vertices (%s binds)", Compact(c.VerticesPerSecond), c.Cores,
			c.BytesPerVertex, Compact(float64(c.DeadlineBound)), Compact(float64(c.MemoryBound)), formatMiB(c.MemoryBytes),
			Compact(float64(c.Budget)), c.Binding)},
	}
	for _, g := range r.Groups {
		for _, e := range g.Events {
			d.Events = append(d.Events, eventRow{Group: g.Name, T: fmt.Sprintf("%.1fs", e.T), What: e.What})
		}
	}
	return reportTemplate.Execute(w, d)
}

// Verdict says in one sentence what the group did: whether it fell over
// (evictions, a late rebalance, duplicates, messages left undone) or held.
func (g GroupSummary) Verdict(deadline time.Duration) string {
	var bad []string
	if g.Evictions > 0 {
		bad = append(bad, plural(g.Evictions, "eviction", "evictions"))
	}
	if g.LateRebalance {
		bad = append(bad, fmt.Sprintf("a rebalance of %.1fs against a deadline of %s", g.RebalanceSeconds, deadline))
	}
	if g.Duplicates > 0 {
		bad = append(bad, fmt.Sprintf("%s processed twice (%s vertices of work redone)", plural(g.Duplicates, "message", "messages"),
			Compact(float64(g.DupVertices))))
	}
	if g.Unprocessed > 0 {
		bad = append(bad, plural(g.Unprocessed, "message", "messages")+" still not done at the end")
	}
	if len(bad) > 0 {
		return fmt.Sprintf("%s fell over: %s.", g.Name, strings.Join(bad, ", "))
	}
	done := "every message was processed or deliberately shed"
	if g.DrainSeconds >= 0 {
		done += fmt.Sprintf(" by %.1fs", g.DrainSeconds)
	}
	reb := ""
	if g.RebalanceSeconds >= 0 {
		reb = fmt.Sprintf(", the rebalance took %.1fs", g.RebalanceSeconds)
	}
	return fmt.Sprintf("%s held: no eviction, no duplicate%s, %s; at most %s vertices in flight.", g.Name, reb, done,
		Compact(float64(g.MaxInflightVertices)))
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", Arial, sans-serif; margin: 2rem auto; max-width: 1100px; padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
.lede { color: #444; }
.verdicts li { margin: .3rem 0; }
.verdicts .naive { color: #b01e1f; }
.verdicts .spillway { color: #17609a; }
table { border-collapse: collapse; margin: .5rem 0; font-variant-numeric: tabular-nums; }
th, td { padding: .25rem .8rem; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child { text-align: left; }
table.setup td { text-align: left; vertical-align: top; }
thead th { border-bottom: 2px solid #ccc; }
figure { margin: 1rem 0; }
figcaption { color: #555; font-size: .92rem; margin-top: .3rem; }
svg.chart { width: 100%; height: auto; display: block; }
footer { color: #777; font-size: .85rem; margin-top: 3rem; }
code { background: #f4f4f4; padding: 0 .2rem; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p class="lede">The same generated stream of real geometry (seed {{.R.Options.Seed}}) on {{if eq .R.Options.Broker "redis"}}Redis
Streams{{else}}an embedded Kafka broker{{end}}, consumed first by a plain Watermill consumer whose concurrency is counted in
messages, then by a Spillway consumer whose admission is counted in vertices. A burst of heavy multipolygons arrives, and a
second consumer joins mid-burst{{if eq .R.Options.Broker "redis"}}, claiming any entry left idle past the
{{.R.Options.Deadline}} redelivery deadline{{else}}, forcing a rebalance under a {{.R.Options.Deadline}} redelivery
deadline{{end}}.</p>
<ul class="verdicts">
{{range $i, $v := .Verdicts}}<li class="{{(index $.S.Groups $i).Name}}">{{$v}}</li>
{{end}}</ul>

<section id="summary">
<h2>Summary</h2>
<table>
<thead><tr>{{range index .Table 0}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>
{{range $i, $row := .Table}}{{if $i}}<tr>{{range $row}}<td>{{.}}</td>{{end}}</tr>
{{end}}{{end}}</tbody>
</table>
<p>{{range .S.Groups}}<b>{{.Name}}</b>: {{.Description}}.<br>{{end}}</p>
</section>

{{range .Charts}}
<section class="chart-section" id="chart-{{.ID}}">
<h2>{{.Title}}</h2>
<figure>
{{.SVG}}
<figcaption>{{.Caption}}</figcaption>
</figure>
</section>
{{end}}

<section id="setup">
<h2>Setup</h2>
<table class="setup">
{{range .Setup}}<tr><td>{{index . 0}}</td><td>{{index . 1}}</td></tr>
{{end}}</table>
</section>

<section id="timeline">
<h2>Timeline</h2>
<table class="setup">
<thead><tr><th>group</th><th>time</th><th>event</th></tr></thead>
{{range .Events}}<tr><td>{{.Group}}</td><td>{{.T}}</td><td>{{.What}}</td></tr>
{{end}}</table>
</section>

<footer>Generated by <code>spillway demo</code> on {{.Generated}}. See docs/demo.md for how to read it.</footer>
</body>
</html>
`))

func deadlineLine(o Options) string {
	if o.Broker == "redis" {
		return fmt.Sprintf("MaxIdleTime %s for both groups (claims checked every %s); the second consumer joins %s after the burst",
			o.Deadline, o.Deadline/4, o.JoinAfter)
	}
	return fmt.Sprintf("Kafka Rebalance.Timeout %s for both groups (heartbeat %s); the second consumer joins %s after the burst",
		o.Deadline, o.Heartbeat, o.JoinAfter)
}

func brokerLine(o Options) string {
	if o.Broker == "redis" {
		return "Redis Streams (a local redis-server), a fresh server per group; the plain consumer is watermill-redisstream " +
			"(one message per topic at a time), Spillway's router has 4 consumers per topic and a keep-alive"
	}
	return fmt.Sprintf("embedded Kafka (kfake), a fresh cluster per group, %d partitions per topic; the plain consumer is "+
		"watermill-kafka (one unacked message per partition)", o.Partitions)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
