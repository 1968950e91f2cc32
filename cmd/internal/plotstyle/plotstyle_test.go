package plotstyle

import (
	"bytes"
	"slices"
	"strconv"
	"testing"

	"gonum.org/v1/plot"
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

// Round steps: 0–1,000,000 in steps of 200,000 (six labels); 0–7 in steps
// of 2 (a sixth of the range is 1.17, so the next round step up); nothing
// for an empty range.
func TestRoundTicks(t *testing.T) {
	label := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	ticker := RoundTicks(label)
	var got []string
	for _, tk := range ticker.Ticks(0, 1_000_000) {
		got = append(got, tk.Label)
	}
	if want := []string{"0", "200000", "400000", "600000", "800000", "1000000"}; !slices.Equal(got, want) {
		t.Errorf("ticks %v, want %v", got, want)
	}
	got = got[:0]
	for _, tk := range ticker.Ticks(0, 7) {
		got = append(got, tk.Label)
	}
	if want := []string{"0", "2", "4", "6"}; !slices.Equal(got, want) {
		t.Errorf("ticks for 0-7: %v, want %v", got, want)
	}
	if ticks := ticker.Ticks(5, 5); ticks != nil {
		t.Errorf("ticks for an empty range: %v", ticks)
	}
}

// A grid of plots is one SVG document with the font fallback, an empty
// cell included.
func TestSVGGrid(t *testing.T) {
	line, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 1}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := New(), New()
	a.Title.Text, b.Title.Text = "left panel", "right panel"
	a.Add(line)
	b.Add(line)
	svg, err := SVGGrid([][]*plot.Plot{{a, b}, {a}}, 6*vg.Inch, 4*vg.Inch, vg.Points(10))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(svg, []byte("<svg")) != 1 || !bytes.Contains(svg, fallback) || bytes.Contains(svg, fontFamily) ||
		!bytes.Contains(svg, []byte("left panel")) || !bytes.Contains(svg, []byte("right panel")) {
		t.Errorf("grid SVG:\n%.400s", svg)
	}
}
