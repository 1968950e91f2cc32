package autoscale

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/spillway-go/spillway/cmd/internal/plotstyle"
)

// runColors tells the runs apart, in the order of Options.Runs.
var runColors = []color.Color{
	color.RGBA{R: 0xd6, G: 0x5f, B: 0x00, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
}

// WriteChart draws, per broker, the processes and the backlog in vertices
// of every run over time.
func (rep *Report) WriteChart(w io.Writer) error {
	var brokers []string
	for _, r := range rep.Runs {
		if !slices.Contains(brokers, r.Broker) {
			brokers = append(brokers, r.Broker)
		}
	}
	if len(brokers) == 0 {
		return errors.New("autoscale: no runs to chart")
	}
	var rows [][]*plot.Plot
	for _, b := range brokers {
		procs := panel(b+": worker processes", "processes")
		backlog := panel(b+": backlog (vertices sent, not finished)", "vertices")
		backlog.Y.Tick.Marker = plotstyle.RoundTicks(func(v float64) string { return strconv.FormatFloat(v/1000, 'f', -1, 64) + "k" })
		i, most := 0, 1
		for _, r := range rep.Runs {
			if r.Broker != b {
				continue
			}
			c := runColors[i%len(runColors)]
			i++
			pp, bp := make(plotter.XYs, len(r.Timeline)), make(plotter.XYs, len(r.Timeline))
			for j, p := range r.Timeline {
				most = max(most, p.Processes)
				pp[j] = plotter.XY{X: p.T, Y: float64(p.Processes)}
				bp[j] = plotter.XY{X: p.T, Y: float64(p.Backlog)}
			}
			for _, x := range []struct {
				p   *plot.Plot
				xys plotter.XYs
			}{{procs, pp}, {backlog, bp}} {
				l, err := plotter.NewLine(x.xys)
				if err != nil {
					return err
				}
				l.Color = c
				l.Width = vg.Points(1.5)
				x.p.Add(l)
				if x.p == procs {
					procs.Legend.Add(fmt.Sprintf("%s, %s", r.Workers, r.Controller), l)
				}
			}
		}
		procs.Y.Max = float64(most)*1.5 + 1 // room for the legend above the lines
		rows = append(rows, []*plot.Plot{procs, backlog})
	}
	svg, err := plotstyle.SVGGrid(rows, 28*vg.Centimeter, vg.Length(len(rows))*9*vg.Centimeter, vg.Points(12))
	if err != nil {
		return err
	}
	_, err = w.Write(svg)
	return err
}

func panel(title, y string) *plot.Plot {
	p := plotstyle.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds since the first burst"
	p.Y.Label.Text = y
	p.Y.Min = 0
	p.Legend.Top = true
	p.X.Tick.Marker = plotstyle.RoundTicks(func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) })
	if y == "processes" {
		p.Y.Tick.Marker = plot.TickerFunc(wholeTicks)
	}
	return p
}

// wholeTicks labels whole numbers only, at most about eight of them.
func wholeTicks(lo, hi float64) []plot.Tick {
	step := max(1, math.Ceil((hi-lo)/8))
	var out []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return out
}
