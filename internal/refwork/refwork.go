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

// Hull computes the convex hull and its area.
func Hull(g geom.T) float64 {
	h := xy.ConvexHull(g)
	if p, ok := h.(*geom.Polygon); ok {
		return p.Area()
	}
	return 0
}

// Full is AreaCentroid plus Hull.
func Full(g geom.T) float64 { return AreaCentroid(g) + Hull(g) }

var byName = map[string]Func{
	"noop":          Noop,
	"area-centroid": AreaCentroid,
	"hull":          Hull,
	"full":          Full,
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
