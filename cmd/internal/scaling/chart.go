package scaling

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/spillway-go/spillway/cmd/internal/demo"
	"github.com/spillway-go/spillway/cmd/internal/plotstyle"
)

var (
	costColor = map[string]color.Color{
		CostPing:    color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		CostPolygon: color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
		CostHeavy:   color.RGBA{R: 0xd6, G: 0x5f, B: 0x00, A: 0xff},
	}
	grey   = color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}
	dashed = []vg.Length{vg.Points(5), vg.Points(3)}
	glyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.TriangleGlyph{}, draw.SquareGlyph{}, draw.CrossGlyph{}}
)

// WriteChart draws the report as an SVG chart: per broker, a row of three
// panels against parallelism: messages per second and CPU per message for
// bare and Spillway (the fewest handlers, the first budget), and the CPU
// ratio for every handler count and budget.
func (rep *Report) WriteChart(w io.Writer) error {
	var brokers []string
	for _, r := range rep.Results {
		if !slices.Contains(brokers, r.Broker) {
			brokers = append(brokers, r.Broker)
		}
	}
	if len(brokers) == 0 {
		return fmt.Errorf("scaling: no results to chart")
	}
	o := rep.Options
	minH := slices.Min(o.Handlers)
	var rows [][]*plot.Plot
	for _, b := range brokers {
		tput := rep.panel(b, fmt.Sprintf("%s: messages/s (%d handler%s)", b, minH, plural(minH)), "messages/s", true)
		cpu := rep.panel(b, fmt.Sprintf("%s: CPU µs per message", b), "CPU µs/msg (this process)", true)
		ratio := rep.panel(b, fmt.Sprintf("%s: CPU per message, Spillway / bare", b), "ratio", false)
		for _, c := range o.Costs {
			for _, who := range []string{ConsumerBare, ConsumerSpillway} {
				pts := rep.series(b, c, who, minH, o.Budgets[0])
				if len(pts) == 0 {
					continue
				}
				for _, pp := range []struct {
					p *plot.Plot
					f func(Result) float64
				}{
					{tput, func(r Result) float64 { return r.MessagesPerSecond }},
					{cpu, func(r Result) float64 { return r.CPUPerMessage }},
				} {
					l, s := lineOf(pts, pp.f, costColor[c], who == ConsumerBare, glyphs[0])
					if l == nil {
						continue
					}
					pp.p.Add(l, s)
					if pp.p == tput {
						tput.Legend.Add(c+" "+who, l, s)
					}
				}
			}
			for hi, h := range o.Handlers {
				for bi, bu := range o.Budgets {
					pts := rep.series(b, c, ConsumerSpillway, h, bu)
					if len(pts) == 0 {
						continue
					}
					l, s := lineOf(pts, func(r Result) float64 { return r.CPURatio }, costColor[c], hi > 0, glyphs[bi%len(glyphs)])
					if l != nil {
						ratio.Add(l, s)
					}
				}
			}
		}
		// The ratio panel's legend: what the styles mean.
		for hi, h := range o.Handlers {
			l, _ := plotter.NewLine(plotter.XYs{{X: 1, Y: 1}})
			l.Color = grey
			if hi > 0 {
				l.Dashes = dashed
			}
			ratio.Legend.Add(fmt.Sprintf("%d handler%s", h, plural(h)), l)
		}
		for bi, bu := range o.Budgets {
			s, _ := plotter.NewScatter(plotter.XYs{{X: 1, Y: 1}})
			s.GlyphStyle = draw.GlyphStyle{Color: grey, Radius: vg.Points(3), Shape: glyphs[bi%len(glyphs)]}
			ratio.Legend.Add("budget "+demo.Compact(float64(bu)), s)
		}
		// Headroom above the data for the legends at the top.
		for _, p := range []*plot.Plot{tput, cpu} {
			if p.Y.Min > 0 && p.Y.Max > p.Y.Min {
				p.Y.Max *= math.Pow(p.Y.Max/p.Y.Min, 0.8)
			}
		}
		ratio.Y.Max = math.Max(ratio.Y.Max, 1) * 1.45
		one, err := plotter.NewLine(plotter.XYs{{X: ratio.X.Min, Y: 1}, {X: ratio.X.Max, Y: 1}})
		if err != nil {
			return err
		}
		one.Color, one.Dashes = grey, []vg.Length{vg.Points(1), vg.Points(2)}
		ratio.Add(one)
		ratio.Y.Min = 0
		ratio.Y.Tick.Marker = plotstyle.RoundTicks(func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) })
		rows = append(rows, []*plot.Plot{tput, cpu, ratio})
	}
	svg, err := plotstyle.SVGGrid(rows, 14*vg.Inch, vg.Length(len(rows))*4*vg.Inch, vg.Points(14))
	if err != nil {
		return err
	}
	_, err = w.Write(svg)
	return err
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// panel is an empty panel for broker b, parallelism on a logarithmic x
// axis, y logarithmic or linear.
func (rep *Report) panel(b, title, ylabel string, logY bool) *plot.Plot {
	p := plotstyle.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = parallelName(b) + " per topic"
	p.Y.Label.Text = ylabel
	lo, hi := slices.Min(rep.Options.Parallelism), slices.Max(rep.Options.Parallelism)
	p.X.Scale = plot.LogScale{}
	p.X.Min, p.X.Max = float64(lo)/1.3, float64(hi)*1.3
	var ticks []plot.Tick
	for _, v := range rep.Options.Parallelism {
		ticks = append(ticks, plot.Tick{Value: float64(v), Label: strconv.Itoa(v)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Legend.Padding = vg.Points(1)
	return p
}

// series returns the results of one line, by parallelism.
func (rep *Report) series(b, c, who string, h int, budget int64) []Result {
	var out []Result
	for _, r := range rep.Results {
		if r.Broker == b && r.Cost == c && r.Consumer == who && r.Handlers == h &&
			(who == ConsumerBare || r.Budget == budget) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Result) int { return a.Parallelism - b.Parallelism })
	return out
}

// lineOf draws f over pts; nil when no point has a value.
func lineOf(pts []Result, f func(Result) float64, c color.Color, dash bool, g draw.GlyphDrawer) (*plotter.Line, *plotter.Scatter) {
	xys := make(plotter.XYs, 0, len(pts))
	for _, r := range pts {
		if y := f(r); y > 0 && !math.IsInf(y, 0) {
			xys = append(xys, plotter.XY{X: float64(r.Parallelism), Y: y})
		}
	}
	if len(xys) == 0 {
		return nil, nil
	}
	l, _ := plotter.NewLine(xys)
	l.Color, l.Width = c, vg.Points(1.5)
	if dash {
		l.Dashes = dashed
	}
	s, _ := plotter.NewScatter(xys)
	s.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(2.5), Shape: g}
	return l, s
}
