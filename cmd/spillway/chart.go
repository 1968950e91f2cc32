package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/spillway-go/spillway/cmd/internal/plotstyle"
	"github.com/spillway-go/spillway/sizing"
)

// chartData is what the chart shows: the budget each bound permits as the
// share of heavy geometry (by vertices) goes from 0 to 100 %.
//
// The memory bound is drawn flat, at the bytes per vertex measured on the
// whole sample: memory per vertex depends on the encoding and the precision
// of the coordinates far more than on the size of the geometry, and
// measuring it per class would mostly add noise. The deadline bound follows
// the throughput of each mix, combined harmonically from the light and
// heavy rates ([mixThroughput]).
type chartData struct {
	handler     string
	memoryBytes int64
	processes   int
	deadline    time.Duration
	headroom    float64
	memoryBound float64
	measured    float64 // the deadline bound measured on the whole sample
	bpv         float64
	heavyAbove  int
	lightVPS    float64
	heavyVPS    float64
	lightN      int
	heavyN      int
	sampleShare float64 // heavy share of the sample's vertices
}

func newChartData(o *sizeOptions, in sizing.Inputs, rec recommendation, light, heavy *sizing.Sample, lightVPS, heavyVPS float64) *chartData {
	lightVertices, _ := sampleTotals(light)
	heavyVertices, _ := sampleTotals(heavy)
	return &chartData{
		handler:     o.handler,
		memoryBytes: in.MemoryBytes,
		processes:   in.Processes,
		deadline:    in.Deadline,
		headroom:    rec.drainShare,
		memoryBound: float64(rec.MemoryBound),
		measured:    float64(rec.DeadlineBound),
		bpv:         in.BytesPerVertex,
		heavyAbove:  o.heavyAbove,
		lightVPS:    lightVPS,
		heavyVPS:    heavyVPS,
		lightN:      len(light.Payloads),
		heavyN:      len(heavy.Payloads),
		sampleShare: float64(heavyVertices) / float64(heavyVertices+lightVertices),
	}
}

// mixThroughput returns the throughput, in vertices per second, of a stream
// in which a share heavyShare (0 to 1, by vertices) of the vertices belongs
// to heavy geometries processed at heavyVPS and the rest to light ones
// processed at lightVPS.
//
// The rates combine harmonically, not linearly: a vertex costs 1/rate
// seconds, so a stream's seconds per vertex is the vertex-share-weighted
// mean of the two classes' seconds per vertex, and its throughput is the
// inverse of that. Averaging the rates themselves would overstate the
// throughput of every mix, because the slow class takes more of the time
// than its share of the vertices.
func mixThroughput(lightVPS, heavyVPS, heavyShare float64) float64 {
	s := min(max(heavyShare, 0), 1)
	switch s {
	case 0:
		return lightVPS
	case 1:
		return heavyVPS
	}
	secsPerVertex := s/heavyVPS + (1-s)/lightVPS
	return 1 / secsPerVertex
}

// deadlineBound is the deadline bound at heavy share s.
func (c *chartData) deadlineBound(s float64) float64 {
	return mixThroughput(c.lightVPS, c.heavyVPS, s) * c.deadline.Seconds() * c.headroom
}

// crossover returns the heavy share at which the deadline bound equals the
// memory bound, if that happens between 0 and 100 %.
func (c *chartData) crossover() (float64, bool) {
	// deadlineBound(s) = M  ⇔  s/h + (1-s)/l = D·H/M.
	want := c.deadline.Seconds() * c.headroom / c.memoryBound
	il, ih := 1/c.lightVPS, 1/c.heavyVPS
	if il == ih || c.memoryBound <= 0 {
		return 0, false
	}
	s := (want - il) / (ih - il)
	if s < 0 || s > 1 || math.IsNaN(s) {
		return 0, false
	}
	return s, true
}

func (c *chartData) report(path string) *mixReport {
	r := &mixReport{
		Chart:                  path,
		HeavyAbove:             c.heavyAbove,
		HeavyShare:             c.sampleShare,
		LightGeometries:        c.lightN,
		HeavyGeometries:        c.heavyN,
		LightVerticesPerSecond: c.lightVPS,
		HeavyVerticesPerSecond: c.heavyVPS,
	}
	if s, ok := c.crossover(); ok {
		r.Crossover = crossing{Crosses: true, HeavyShare: s, Budget: int64(c.memoryBound)}
	}
	return r
}

var (
	memoryColor   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	deadlineColor = color.RGBA{R: 0xd6, G: 0x5f, B: 0x00, A: 0xff}
	budgetColor   = color.RGBA{R: 0x30, G: 0x30, B: 0x30, A: 0x40}
	markColor     = color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}
)

// render draws the chart as SVG to w.
func (c *chartData) render(w io.Writer) error {
	p := plotstyle.New()
	p.Title.Text = fmt.Sprintf("Vertex budget by bound vs. heavy share (handler %q, %s / %d process, deadline %v x %.2g)",
		c.handler, formatBytes(c.memoryBytes), c.processes, c.deadline, c.headroom)
	if c.processes != 1 {
		p.Title.Text = fmt.Sprintf("Vertex budget by bound vs. heavy share (handler %q, %s / %d processes, deadline %v x %.2g)",
			c.handler, formatBytes(c.memoryBytes), c.processes, c.deadline, c.headroom)
	}
	p.X.Label.Text = fmt.Sprintf("share of vertices in heavy geometries (more than %d vertices), %%", c.heavyAbove)
	p.Y.Label.Text = "vertex budget"
	p.X.Min, p.X.Max = 0, 100
	var xt []plot.Tick
	for v := 0; v <= 100; v += 10 {
		t := plot.Tick{Value: float64(v)}
		if v%20 == 0 {
			t.Label = fmt.Sprint(v)
		}
		xt = append(xt, t)
	}
	p.X.Tick.Marker = plot.ConstantTicks(xt)
	p.Y.Min = 0
	p.Y.Tick.Marker = plotstyle.RoundTicks(short)
	// Top left: thumbnails first, so a viewer font wider than the one
	// measured here only pushes the text further right.
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8)
	p.Legend.YOffs = -vg.Points(4)
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Legend.Padding = vg.Points(2)
	p.Title.TextStyle.Font.Size = vg.Points(11)

	const steps = 200
	mem := make(plotter.XYs, 0, steps+1)
	dl := make(plotter.XYs, 0, steps+1)
	bud := make(plotter.XYs, 0, steps+1)
	top := c.memoryBound
	for i := 0; i <= steps; i++ {
		s := float64(i) / steps
		d := c.deadlineBound(s)
		mem = append(mem, plotter.XY{X: 100 * s, Y: c.memoryBound})
		dl = append(dl, plotter.XY{X: 100 * s, Y: d})
		bud = append(bud, plotter.XY{X: 100 * s, Y: math.Min(d, c.memoryBound)})
		top = math.Max(top, d)
	}
	p.Y.Max = top * 1.3

	budLine, err := plotter.NewLine(bud)
	if err != nil {
		return err
	}
	budLine.Color, budLine.Width = budgetColor, vg.Points(9)
	memLine, err := plotter.NewLine(mem)
	if err != nil {
		return err
	}
	memLine.Color, memLine.Width = memoryColor, vg.Points(2)
	dlLine, err := plotter.NewLine(dl)
	if err != nil {
		return err
	}
	dlLine.Color, dlLine.Width = deadlineColor, vg.Points(2)
	p.Add(budLine, memLine, dlLine)
	p.Legend.Add(fmt.Sprintf("memory bound (%.0f B/vertex)", c.bpv), memLine)
	p.Legend.Add(fmt.Sprintf("deadline bound (%s vertices/s light, %s heavy)", short(c.lightVPS), short(c.heavyVPS)), dlLine)
	p.Legend.Add("budget: the smaller bound", budLine)

	// The sample's own mix.
	x := 100 * c.sampleShare
	mix, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: top * 1.05}})
	if err != nil {
		return err
	}
	mix.Color, mix.Dashes = markColor, []vg.Length{vg.Points(3), vg.Points(3)}
	p.Add(mix)
	meas, err := plotter.NewScatter(plotter.XYs{{X: x, Y: c.measured}})
	if err != nil {
		return err
	}
	meas.GlyphStyle = draw.GlyphStyle{Color: deadlineColor, Radius: vg.Points(4), Shape: draw.PyramidGlyph{}}
	p.Add(meas)
	p.Legend.Add("deadline bound measured on the whole sample", meas)
	labels := plotter.XYLabels{
		XYs:    []plotter.XY{{X: x, Y: top * 0.03}}, // low: the legend is at the top
		Labels: []string{fmt.Sprintf(" this sample: %.0f %% heavy", x)},
	}

	// The crossover.
	if s, ok := c.crossover(); ok {
		pt, err := plotter.NewScatter(plotter.XYs{{X: 100 * s, Y: c.memoryBound}})
		if err != nil {
			return err
		}
		pt.GlyphStyle = draw.GlyphStyle{Color: color.Black, Radius: vg.Points(4), Shape: draw.CircleGlyph{}}
		p.Add(pt)
		labels.XYs = append(labels.XYs, plotter.XY{X: 100 * s, Y: c.memoryBound})
		labels.Labels = append(labels.Labels, fmt.Sprintf("  crossover: %.0f %% heavy, %s vertices", 100*s, short(c.memoryBound)))
	}
	lbl, err := plotter.NewLabels(labels)
	if err != nil {
		return err
	}
	lbl.Offset = vg.Point{X: vg.Points(2), Y: vg.Points(5)}
	for i := range lbl.TextStyle {
		lbl.TextStyle[i].Font.Size = vg.Points(9)
		lbl.TextStyle[i].YAlign = draw.YBottom
		if labels.XYs[i].X > 60 {
			lbl.TextStyle[i].XAlign = draw.XRight
		}
	}
	p.Add(lbl)

	svg, err := plotstyle.SVG(p, 9*vg.Inch, 5*vg.Inch, vg.Points(12))
	if err != nil {
		return err
	}
	_, err = w.Write(svg)
	return err
}
