package cost

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/encoding/geojson"
)

// geoJSONObject holds the members of any GeoJSON object that matter for
// counting. Properties and other foreign members are skipped by the JSON
// scanner without being stored. Collections are decoded in the same pass, so
// nested input is scanned once; the depth is enforced afterwards, before any
// coordinates are decoded (encoding/json itself bounds JSON nesting).
//
// Geometry is only used for a top-level Feature. document points it at an
// object whose Type is missingType before decoding: encoding/json leaves it
// alone when the member is missing, sets it to nil when the member is null,
// and decodes into it otherwise. That tells the three cases apart without
// scanning the geometry a second time, as optionalGeometry must.
type geoJSONObject struct {
	Type        string            `json:"type"`
	Coordinates json.RawMessage   `json:"coordinates"`
	Geometries  []*geoJSONObject  `json:"geometries"`
	Geometry    *geoJSONObject    `json:"geometry"`
	Features    []*geoJSONFeature `json:"features"`
}

// missingType marks a Feature's geometry that was not in the input. A NUL
// byte never appears in a valid type name.
const missingType = "\x00missing"

// geoJSONFeature is a member of a FeatureCollection.
type geoJSONFeature struct {
	Type     string           `json:"type"`
	Geometry optionalGeometry `json:"geometry"`
}

// optionalGeometry tells a missing "geometry" member from a null one.
type optionalGeometry struct {
	present bool
	g       *geoJSONObject // nil when the member is null
}

// UnmarshalJSON implements json.Unmarshaler.
func (o *optionalGeometry) UnmarshalJSON(b []byte) error {
	o.present = true
	if isJSONNull(b) {
		o.g = nil
		return nil
	}
	o.g = new(geoJSONObject)
	return json.Unmarshal(b, o.g)
}

func isJSONNull(b []byte) bool { return len(b) == 0 || string(b) == "null" }

// geoJSONWalk decodes GeoJSON into a geometry (build) or only counts its
// vertices. Both modes share every structural rule, so they accept the same
// inputs; only leaf coordinates differ: go-geom decodes them when building,
// countCoordinates (which mirrors go-geom's rules) scans them when counting.
type geoJSONWalk struct {
	build bool
	parts *int // when counting and not nil: adds the geometries' parts
}

// decodeGeoJSON decodes a GeoJSON Geometry, Feature or FeatureCollection.
func decodeGeoJSON(b []byte) (geom.T, error) {
	g, _, err := geoJSONWalk{build: true}.document(b)
	return g, err
}

// countGeoJSON counts the vertices of a GeoJSON Geometry, Feature or
// FeatureCollection without building the geometry.
func countGeoJSON(b []byte) (int, error) {
	_, n, err := geoJSONWalk{}.document(b)
	return n, err
}

// countGeoJSONParts is countGeoJSON that also returns the number of
// coordinate arrays above the positions (see countCoordinates).
func countGeoJSONParts(b []byte) (vertices, parts int, err error) {
	_, vertices, err = geoJSONWalk{parts: &parts}.document(b)
	return vertices, parts, err
}

// document walks a whole GeoJSON payload. When building, it returns the
// geometry and its vertex count; when counting, a nil geometry.
func (w geoJSONWalk) document(b []byte) (geom.T, int, error) {
	obj := geoJSONObject{Geometry: &geoJSONObject{Type: missingType}}
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, 0, fmt.Errorf("%w: geojson: %w", ErrMalformed, err)
	}
	switch obj.Type {
	case "Feature":
		g := optionalGeometry{present: true, g: obj.Geometry}
		if g.g != nil && g.g.Type == missingType {
			g = optionalGeometry{}
		}
		return w.feature(g, -1, 1)
	case "FeatureCollection":
		if obj.Features == nil {
			return nil, 0, fmt.Errorf("%w: geojson: FeatureCollection has no features array", ErrMalformed)
		}
		var gc *geom.GeometryCollection
		if w.build {
			gc = geom.NewGeometryCollection()
		}
		total := 0
		for i, f := range obj.Features {
			if f == nil || f.Type != "Feature" {
				t := "null"
				if f != nil {
					t = fmt.Sprintf("%q", f.Type)
				}
				return nil, 0, fmt.Errorf("%w: geojson: feature %d has type %s, want \"Feature\"", ErrMalformed, i, t)
			}
			g, n, err := w.feature(f.Geometry, i, 2)
			if err != nil {
				return nil, 0, err
			}
			total += n
			if w.build {
				if err := gc.Push(g); err != nil { // cannot fail: gc has no layout
					return nil, 0, fmt.Errorf("%w: geojson: feature %d: %w", ErrMalformed, i, err)
				}
			}
		}
		if w.build {
			return gc, total, nil
		}
		return nil, total, nil
	case "Point", "MultiPoint", "LineString", "MultiLineString", "Polygon", "MultiPolygon", "GeometryCollection":
		return w.geometry(&obj, 1)
	case "":
		return nil, 0, fmt.Errorf("%w: JSON object has no GeoJSON \"type\" member", errUnknownFormat)
	default:
		return nil, 0, fmt.Errorf("%w: JSON object has unsupported GeoJSON type %q", errUnknownFormat, obj.Type)
	}
}

// feature walks the geometry of feature index (-1 for a lone feature) at the
// given depth. A null geometry is an empty collection.
func (w geoJSONWalk) feature(o optionalGeometry, index, depth int) (geom.T, int, error) {
	if !o.present {
		if index < 0 {
			// Or a geometry without a type, which decodes the same way.
			return nil, 0, fmt.Errorf("%w: geojson: Feature has no \"geometry\" member with a \"type\"", ErrMalformed)
		}
		return nil, 0, fmt.Errorf("%w: geojson: feature %d has no \"geometry\" member", ErrMalformed, index)
	}
	if o.g == nil {
		if w.build {
			return geom.NewGeometryCollection(), 0, nil
		}
		return nil, 0, nil
	}
	g, n, err := w.geometry(o.g, depth)
	if err != nil && index >= 0 {
		return nil, 0, fmt.Errorf("feature %d: %w", index, err)
	}
	return g, n, err
}

// coordinateLevels is how deeply each geometry type nests its coordinate
// arrays: 1 for a single position.
var coordinateLevels = map[string]int{
	"Point":           1,
	"LineString":      2,
	"MultiPoint":      2,
	"Polygon":         3,
	"MultiLineString": 3,
	"MultiPolygon":    4,
}

// geometry walks a GeoJSON Geometry object nested depth levels deep.
func (w geoJSONWalk) geometry(o *geoJSONObject, depth int) (geom.T, int, error) {
	if depth > maxNestingDepth {
		return nil, 0, fmt.Errorf("%w: geojson: geometry nested deeper than %d levels", ErrTooLarge, maxNestingDepth)
	}
	if o.Type == "GeometryCollection" {
		var gc *geom.GeometryCollection
		if w.build {
			gc = geom.NewGeometryCollection()
		}
		total := 0
		for i, member := range o.Geometries {
			if member == nil {
				return nil, 0, fmt.Errorf("%w: geojson: GeometryCollection member %d is null", ErrMalformed, i)
			}
			g, n, err := w.geometry(member, depth+1)
			if err != nil {
				return nil, 0, err
			}
			total += n
			if w.build {
				if err := gc.Push(g); err != nil { // cannot fail: gc has no layout
					return nil, 0, fmt.Errorf("%w: geojson: %w", ErrMalformed, err)
				}
			}
		}
		if w.build {
			return gc, total, nil
		}
		return nil, total, nil
	}
	levels, ok := coordinateLevels[o.Type]
	if !ok {
		return nil, 0, fmt.Errorf("%w: geojson: unsupported geometry type %q", ErrMalformed, o.Type)
	}

	var (
		g       geom.T
		n       int
		members int
	)
	if w.build {
		gj := geojson.Geometry{Type: o.Type}
		if !isJSONNull(o.Coordinates) {
			gj.Coordinates = &o.Coordinates
		}
		var err error
		if g, err = guard("geojson", gj.Decode); err != nil {
			return nil, 0, err
		}
		n, members = Vertices(g), numMembers(g)
	} else if !isJSONNull(o.Coordinates) { // a null or missing array is an empty geometry
		var (
			parts int
			err   error
		)
		if n, members, parts, err = countCoordinates(o.Coordinates, levels, o.Type == "MultiPoint"); err != nil {
			return nil, 0, fmt.Errorf("%w: geojson: %s coordinates: %w", ErrMalformed, o.Type, err)
		}
		if w.parts != nil {
			*w.parts += parts
		}
	}
	// Members of multi-geometries count as nested, as they do in WKB.
	if strings.HasPrefix(o.Type, "Multi") && members > 0 && depth+1 > maxNestingDepth {
		return nil, 0, fmt.Errorf("%w: geojson: geometry nested deeper than %d levels", ErrTooLarge, maxNestingDepth)
	}
	return g, n, nil
}

// numMembers is the number of members of a multi-geometry, 0 for other
// geometries.
func numMembers(g geom.T) int {
	switch g := g.(type) {
	case *geom.MultiPoint:
		return g.NumPoints()
	case *geom.MultiLineString:
		return g.NumLineStrings()
	case *geom.MultiPolygon:
		return g.NumPolygons()
	}
	return 0
}
