package plotstyle

import (
	"bytes"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// measuredFont is the font gonum/plot measures the text with (it ships
// with gonum/plot, so the layout does not depend on the machine).
var measuredFont = font.Font{Typeface: "Liberation", Variant: "Sans"}

// fontFamily is how the SVG names measuredFont, and fallback what it
// becomes: viewers without Liberation Sans get a sans-serif of about the
// same width rather than their default serif.
var (
	fontFamily = []byte("font-family:Liberation Sans;")
	fallback   = []byte("font-family:'Liberation Sans',Arial,Helvetica,sans-serif;")
)

// New returns a plot with the shared look: Liberation Sans (set as
// gonum/plot's default font, a package-level setting), a grid and padding
// under the title. Callers set the rest.
func New() *plot.Plot {
	plot.DefaultFont, plotter.DefaultFont = measuredFont, measuredFont
	p := plot.New()
	p.Title.Padding = vg.Points(6)
	p.Add(plotter.NewGrid())
	return p
}

// SVG draws p on a width × height canvas with a margin of pad on the left
// and right and pad/2 at the top and bottom, so text drawn by a viewer with
// a wider font than the measured one is not cut off, and returns the SVG
// document with the font fallback in place.
func SVG(p *plot.Plot, width, height, pad vg.Length) ([]byte, error) {
	c := vgsvg.New(width, height)
	p.Draw(draw.Crop(draw.New(c), pad, -pad, pad/2, -pad/2))
	return finish(c)
}

// SVGGrid is [SVG] for a grid of plots on one canvas: rows of plots (a nil
// plot leaves its cell empty), their axes aligned, pad apart.
func SVGGrid(rows [][]*plot.Plot, width, height, pad vg.Length) ([]byte, error) {
	c := vgsvg.New(width, height)
	cols := 0
	for _, r := range rows {
		cols = max(cols, len(r))
	}
	grid := make([][]*plot.Plot, len(rows))
	for i, r := range rows {
		grid[i] = make([]*plot.Plot, cols)
		copy(grid[i], r)
	}
	tiles := draw.Tiles{Rows: len(rows), Cols: cols, PadX: pad, PadY: pad}
	canvases := plot.Align(grid, tiles, draw.Crop(draw.New(c), pad, -pad, pad/2, -pad/2))
	for i, r := range grid {
		for j, p := range r {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	return finish(c)
}

// finish writes the canvas out with the font fallback in place.
func finish(c *vgsvg.Canvas) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, err
	}
	return bytes.ReplaceAll(buf.Bytes(), fontFamily, fallback), nil
}

// RoundTicks labels a linear axis every 1, 2, 2.5 or 5 × 10^k, whichever
// gives five to ten labels, each written by label.
func RoundTicks(label func(float64) string) plot.Ticker {
	return plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		if hi <= lo {
			return nil
		}
		raw := (hi - lo) / 6
		mag := math.Pow(10, math.Floor(math.Log10(raw)))
		step := 10 * mag
		for _, m := range []float64{1, 2, 2.5, 5} {
			if m*mag >= raw {
				step = m * mag
				break
			}
		}
		var ticks []plot.Tick
		for v := math.Ceil(lo/step) * step; v <= hi; v += step {
			ticks = append(ticks, plot.Tick{Value: v, Label: label(v)})
		}
		return ticks
	})
}
