package plotstyle

import (
	"bytes"
	"testing"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// The SVG names the fallback fonts, never the bare measured font.
func TestSVGFallsBackToSansSerif(t *testing.T) {
	p := New()
	p.Title.Text = "title"
	line, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 1}})
	if err != nil {
		t.Fatal(err)
	}
	p.Add(line)
	svg, err := SVG(p, 4*vg.Inch, 3*vg.Inch, vg.Points(10))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(svg, []byte("<svg")) || !bytes.Contains(svg, fallback) || bytes.Contains(svg, fontFamily) {
		t.Errorf("SVG without the font fallback:\n%.400s", svg)
	}
}
