// Package refwork holds reference handler bodies: CPU-bound geometry work
// whose cost grows with the vertex count, used by the examples, the demo
// and the sizing tool as stand-ins for a user's real handler.
package refwork

import (
	"fmt"
	"sort"

	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/xy"

	"github.com/spillway-go/spillway/cost"
)

// Func does one unit of work on a decoded geometry and returns a number
// derived from it (so the work cannot be optimised away).
type Func func(g geom.T) float64

// Noop does nothing: the cost of decoding alone.
func Noop(geom.T) float64 { return 0 }

// AreaCentroid computes the planar area and the centroid.
func AreaCentroid(g geom.T) float64 {
	var a float64
	if s, ok := g.(interface{ Area() float64 }); ok {
		a = s.Area()
	}
	c, err := xy.Centroid(g)
	if err != nil || len(c) == 0 {
		return a
	}
	return a + c[0]
}

// Hull computes the convex hull and its area. go-geom's hull panics on some
// degenerate input (every point on one line); such a hull has no area, and
// Hull returns 0 for it.
func Hull(g geom.T) (area float64) {
	defer func() {
		if recover() != nil {
			area = 0
		}
	}()
	h := xy.ConvexHull(g)
	if p, ok := h.(*geom.Polygon); ok {
		return p.Area()
	}
	return 0
}

// Full is AreaCentroid plus Hull.
func Full(g geom.T) float64 { return AreaCentroid(g) + Hull(g) }

// Crossings counts the pairs of segments of g that properly cross, by
// comparing every segment with every other one: quadratic in the vertex
// count. It stands for handlers whose cost per vertex grows with the size of
// the geometry (validation, overlay or nearest-neighbour search without a
// spatial index), for which a heavy geometry costs more per vertex than a
// light one.
func Crossings(g geom.T) float64 {
	segs := appendSegments(nil, g)
	n := 0
	for i := range segs {
		for j := i + 1; j < len(segs); j++ {
			if segs[i].crosses(segs[j]) {
				n++
			}
		}
	}
	return float64(n)
}

type segment struct{ ax, ay, bx, by float64 }

// crosses reports whether s and t intersect at a single point inside both
// (touching at an end or overlapping does not count).
func (s segment) crosses(t segment) bool {
	d1 := orient(t.ax, t.ay, t.bx, t.by, s.ax, s.ay)
	d2 := orient(t.ax, t.ay, t.bx, t.by, s.bx, s.by)
	d3 := orient(s.ax, s.ay, s.bx, s.by, t.ax, t.ay)
	d4 := orient(s.ax, s.ay, s.bx, s.by, t.bx, t.by)
	return d1*d2 < 0 && d3*d4 < 0
}

// orient is twice the signed area of the triangle (a, b, c).
func orient(ax, ay, bx, by, cx, cy float64) float64 {
	return (bx-ax)*(cy-ay) - (by-ay)*(cx-ax)
}

// appendSegments appends the segments of every line and ring of g.
func appendSegments(segs []segment, g geom.T) []segment {
	line := func(flat []float64, stride int) {
		for i := 0; i+2*stride <= len(flat); i += stride {
			segs = append(segs, segment{flat[i], flat[i+1], flat[i+stride], flat[i+stride+1]})
		}
	}
	switch g := g.(type) {
	case *geom.LineString:
		line(g.FlatCoords(), g.Stride())
	case *geom.LinearRing:
		line(g.FlatCoords(), g.Stride())
	case *geom.MultiLineString, *geom.Polygon:
		flat, stride, start := g.FlatCoords(), g.Stride(), 0
		for _, end := range g.Ends() {
			line(flat[start:end], stride)
			start = end
		}
	case *geom.MultiPolygon:
		flat, stride, start := g.FlatCoords(), g.Stride(), 0
		for _, ends := range g.Endss() {
			for _, end := range ends {
				line(flat[start:end], stride)
				start = end
			}
		}
	case *geom.GeometryCollection:
		for _, m := range g.Geoms() {
			segs = appendSegments(segs, m)
		}
	}
	return segs
}

var byName = map[string]Func{
	"noop":          Noop,
	"area-centroid": AreaCentroid,
	"hull":          Hull,
	"full":          Full,
	"crossings":     Crossings,
}

// Descriptions says in a few words what each reference handler does.
var Descriptions = map[string]string{
	"noop":          "decode only",
	"area-centroid": "decode, planar area and centroid (linear)",
	"hull":          "decode, convex hull and its area (n log n)",
	"full":          "decode, area, centroid and convex hull",
	"crossings":     "decode, brute-force count of crossing segments (quadratic)",
}

// Names lists the reference handlers by name.
func Names() []string {
	n := make([]string, 0, len(byName))
	for k := range byName {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// ByName returns the named reference handler.
func ByName(name string) (Func, error) {
	f, ok := byName[name]
	if !ok {
		return nil, fmt.Errorf("refwork: unknown handler %q (have %v)", name, Names())
	}
	return f, nil
}

// Process decodes payload and runs f on it passes times; passes scales the
// work per vertex so a demo can make geometry as expensive as it needs.
func Process(f Func, payload []byte, passes int) (float64, error) {
	g, err := cost.Decode(payload)
	if err != nil {
		return 0, err
	}
	var sum float64
	for range max(passes, 1) {
		sum += f(g)
	}
	return sum, nil
}

// ProcessUntil is [Process] that calls stop before every pass and gives up
// as soon as it returns true: ok is then false. A nil stop never stops.
// It lets a long-running reference handler be abandoned at shutdown.
func ProcessUntil(f Func, payload []byte, passes int, stop func() bool) (sum float64, ok bool, err error) {
	g, err := cost.Decode(payload)
	if err != nil {
		return 0, false, err
	}
	for range max(passes, 1) {
		if stop != nil && stop() {
			return sum, false, nil
		}
		sum += f(g)
	}
	return sum, true, nil
}
