package cost

import "github.com/twpayne/go-geom"

// Vertices returns the number of coordinates stored in g: one per point,
// every point of every line, every point of every ring of every polygon
// (closing points included, exactly as stored), summed over the members of
// multi-geometries and, recursively, over the members of a
// [geom.GeometryCollection].
//
// A nil geometry, a typed nil pointer, an empty geometry and a geometry
// without a layout (stride 0) all count 0. A collection must not contain
// itself.
func Vertices(g geom.T) int {
	switch g := g.(type) {
	case nil:
		return 0
	case *geom.GeometryCollection:
		if g == nil {
			return 0
		}
		n := 0
		for _, member := range g.Geoms() {
			n += Vertices(member)
		}
		return n
	case *geom.Point:
		if g == nil {
			return 0
		}
		return flatCount(g.FlatCoords(), g.Stride())
	case *geom.MultiPoint:
		if g == nil {
			return 0
		}
		return flatCount(g.FlatCoords(), g.Stride())
	case *geom.LineString:
		if g == nil {
			return 0
		}
		return flatCount(g.FlatCoords(), g.Stride())
	case *geom.LinearRing:
		if g == nil {
			return 0
		}
		return flatCount(g.FlatCoords(), g.Stride())
	case *geom.MultiLineString:
		if g == nil {
			return 0
		}
		return flatCount(g.FlatCoords(), g.Stride())
	case *geom.Polygon:
		if g == nil {
			return 0
		}
		return flatCount(g.FlatCoords(), g.Stride())
	case *geom.MultiPolygon:
		if g == nil {
			return 0
		}
		return flatCount(g.FlatCoords(), g.Stride())
	default:
		// Any other implementation of geom.T stores flat coordinates too.
		return flatCount(g.FlatCoords(), g.Stride())
	}
}

// flatCount is the number of whole coordinates in a flat coordinate slice.
func flatCount(flat []float64, stride int) int {
	if stride <= 0 {
		return 0
	}
	return len(flat) / stride
}
