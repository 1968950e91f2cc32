package cost_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/encoding/ewkb"
	"github.com/twpayne/go-geom/encoding/wkb"
	"github.com/twpayne/go-geom/encoding/wkbcommon"

	"github.com/spillway-go/spillway/cost"
)

// limitGoGeom caps go-geom's per-level element counts for the duration of a
// test, so that go-geom can be called directly on hostile input as a
// reference without allocating gigabytes. CountPayload honours the same
// limits, so the comparison stays exact.
func limitGoGeom(tb testing.TB) {
	saved := wkbcommon.MaxGeometryElements
	tb.Cleanup(func() { wkbcommon.MaxGeometryElements = saved })
	wkbcommon.MaxGeometryElements = [4]int{0, 4096, 4096, 4096}
}

// goGeomDepth is a geometry's nesting depth as MaxNestingDepth counts it.
func goGeomDepth(g geom.T) int {
	switch g := g.(type) {
	case *geom.GeometryCollection:
		d := 0
		for _, member := range g.Geoms() {
			d = max(d, goGeomDepth(member))
		}
		return 1 + d
	case *geom.MultiPoint:
		return 1 + min(g.NumPoints(), 1)
	case *geom.MultiLineString:
		return 1 + min(g.NumLineStrings(), 1)
	case *geom.MultiPolygon:
		return 1 + min(g.NumPolygons(), 1)
	}
	return 1
}

// compareWithGoGeom decodes binary data with go-geom directly and checks
// that CountPayload accepts it exactly when go-geom does (less trailing
// bytes and excessive nesting, which CountPayload rejects on purpose) and
// counts the same.
func compareWithGoGeom(t *testing.T, data []byte) {
	t.Helper()
	if len(data) == 0 || data[0] > 1 {
		return
	}
	isEWKB := len(data) >= 5 && binary.LittleEndian.Uint32(data[1:])&0xE0000000 != 0
	if data[0] == 0 && len(data) >= 5 {
		isEWKB = binary.BigEndian.Uint32(data[1:])&0xE0000000 != 0
	}
	r := bytes.NewReader(data)
	var (
		ref    geom.T
		refErr error
	)
	func() {
		defer func() {
			if p := recover(); p != nil {
				ref, refErr = nil, errPanicked
			}
		}()
		if isEWKB {
			ref, refErr = ewkb.Read(r)
		} else {
			ref, refErr = wkb.Read(r, wkbcommon.WKBOptionEmptyPointHandling(wkbcommon.EmptyPointHandlingNaN))
		}
	}()
	n, err := cost.CountPayload(data)
	refOK := refErr == nil && r.Len() == 0 && goGeomDepth(ref) <= cost.MaxNestingDepth
	switch {
	case refOK && err != nil:
		t.Fatalf("go-geom decodes %x (%d vertices), CountPayload fails: %v", data, cost.Vertices(ref), err)
	case !refOK && err == nil:
		t.Fatalf("CountPayload counts %x as %d vertices, go-geom: %v (%d bytes left)", data, n, refErr, r.Len())
	case refOK && n != cost.Vertices(ref):
		t.Fatalf("%x: CountPayload %d, go-geom %d vertices", data, n, cost.Vertices(ref))
	}
}

type panicError struct{}

func (panicError) Error() string { return "panicked" }

var errPanicked error = panicError{}

// wkbGen generates random, mostly valid WKB and EWKB.
type wkbGen struct {
	r    *rand.Rand
	ewkb bool
}

var layouts = [...]struct {
	iso, flags uint32
	stride     int
}{
	{0, 0, 2},
	{1000, 0x80000000, 3},
	{2000, 0x40000000, 3},
	{3000, 0xC0000000, 4},
}

func (g *wkbGen) geometry(w *wkbBuilder, depth, kind, layout int) {
	if g.r.IntN(20) == 0 { // a member of another layout
		layout = g.r.IntN(len(layouts))
	}
	w.order = binary.LittleEndian
	if g.r.IntN(2) == 0 {
		w.order = binary.BigEndian
	}
	t := uint32(kind)
	if g.ewkb {
		t |= layouts[layout].flags
		if g.r.IntN(4) == 0 {
			t |= 0x20000000
		}
	} else {
		t += layouts[layout].iso
	}
	w.header(t)
	if t&0x20000000 != 0 {
		w.u32(4326)
	}
	stride := layouts[layout].stride
	coords := func(n int) {
		for range n * stride {
			switch g.r.IntN(8) {
			case 0:
				w.f64(math.Float64frombits(geom.PointEmptyCoordHex))
			case 1:
				w.f64(math.NaN())
			default:
				w.f64(g.r.NormFloat64())
			}
		}
	}
	count := func() int { return g.r.IntN(4) }
	switch kind {
	case 1:
		if g.r.IntN(3) == 0 { // an empty point
			for range stride {
				w.f64(math.Float64frombits(geom.PointEmptyCoordHex))
			}
		} else {
			coords(1)
		}
	case 2:
		n := count()
		w.u32(uint32(n))
		coords(n)
	case 3:
		rings := count()
		w.u32(uint32(rings))
		for range rings {
			n := count()
			w.u32(uint32(n))
			coords(n)
		}
	case 4, 5, 6, 7:
		n := count()
		if depth > 4 {
			n = 0
		}
		w.u32(uint32(n))
		for range n {
			member := kind - 3
			if kind == 7 || g.r.IntN(25) == 0 {
				member = 1 + g.r.IntN(7)
			}
			g.geometry(w, depth+1, member, layout)
		}
	}
}

// TestScanBinaryAgreesWithGoGeom generates random WKB and EWKB, mutates some
// of it, and compares CountPayload with go-geom on every sample.
func TestScanBinaryAgreesWithGoGeom(t *testing.T) {
	limitGoGeom(t)
	r := rand.New(rand.NewPCG(1, 2))
	samples := 20000
	if testing.Short() {
		samples = 2000
	}
	for i := range samples {
		g := &wkbGen{r: r, ewkb: i%2 == 1}
		w := newWKB()
		g.geometry(w, 1, 1+r.IntN(7), r.IntN(len(layouts)))
		data := w.bytes()
		switch r.IntN(6) {
		case 0: // corrupt a byte
			data[r.IntN(len(data))] = byte(r.IntN(256))
		case 1: // truncate
			data = data[:r.IntN(len(data))]
		case 2: // overwrite a 32-bit word, often a count
			if len(data) >= 4 {
				at := r.IntN(len(data) - 3)
				binary.LittleEndian.PutUint32(data[at:], uint32(r.IntN(8)))
			}
		}
		compareWithGoGeom(t, data)
	}
}

// geoJSONGen generates random GeoJSON geometries, mostly valid, with the
// oddities go-geom has rules for: nulls, empty arrays, short and mixed
// positions, non-numbers, numbers out of range.
type geoJSONGen struct {
	r *rand.Rand
	b []byte
}

func (g *geoJSONGen) oneIn(n int) bool { return g.r.IntN(n) == 0 }

func (g *geoJSONGen) number() {
	switch g.r.IntN(40) {
	case 0:
		g.b = append(g.b, "1e400"...)
	case 1:
		g.b = append(g.b, "-2.5E-400"...)
	case 2:
		g.b = append(g.b, "null"...)
	case 3:
		g.b = append(g.b, `"1"`...)
	case 4:
		g.b = append(g.b, "true"...)
	case 5:
		g.b = append(g.b, "[1]"...)
	case 6:
		g.b = append(g.b, "{}"...)
	case 7:
		g.b = append(g.b, "1.7976931348623157e308"...)
	default:
		g.b = append(g.b, []byte(strconv.FormatFloat(g.r.NormFloat64()*100, 'g', -1, 64))...)
	}
}

func (g *geoJSONGen) position(dims int) {
	if g.oneIn(60) {
		g.b = append(g.b, "null"...)
		return
	}
	if g.oneIn(30) {
		dims = g.r.IntN(6)
	}
	g.b = append(g.b, '[')
	for i := range dims {
		if i > 0 {
			g.b = append(g.b, ", "...)
		}
		if g.oneIn(10) {
			g.number()
		} else {
			g.b = strconv.AppendInt(g.b, int64(g.r.IntN(100)), 10)
		}
	}
	g.b = append(g.b, ']')
}

// coordinates writes arrays nested levels deep around positions of dims.
func (g *geoJSONGen) coordinates(levels, dims int) {
	if levels == 1 {
		g.position(dims)
		return
	}
	switch {
	case g.oneIn(40):
		g.b = append(g.b, "null"...)
		return
	case g.oneIn(80):
		g.number()
		return
	}
	g.b = append(g.b, '[')
	for i := range g.r.IntN(4) {
		if i > 0 {
			g.b = append(g.b, ',')
		}
		g.coordinates(levels-1, dims)
	}
	g.b = append(g.b, ']')
}

var geoJSONTypes = []struct {
	name   string
	levels int
}{
	{"Point", 1}, {"LineString", 2}, {"MultiPoint", 2}, {"Polygon", 3},
	{"MultiLineString", 3}, {"MultiPolygon", 4}, {"GeometryCollection", 0},
}

func (g *geoJSONGen) geometry(depth int) {
	t := geoJSONTypes[g.r.IntN(len(geoJSONTypes))]
	if depth > 3 && t.levels == 0 {
		t = geoJSONTypes[0]
	}
	g.b = append(g.b, `{"type":"`+t.name+`"`...)
	if t.levels == 0 {
		g.b = append(g.b, `,"geometries":[`...)
		for i := range g.r.IntN(4) {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.geometry(depth + 1)
		}
		g.b = append(g.b, "]}"...)
		return
	}
	if g.oneIn(20) { // no coordinates member
		g.b = append(g.b, '}')
		return
	}
	g.b = append(g.b, `,"coordinates":`...)
	g.coordinates(t.levels, 2+g.r.IntN(4))
	g.b = append(g.b, '}')
}

// TestCountGeoJSONAgreesWithDecode generates random GeoJSON and checks that
// the scanning counter agrees with go-geom's decoder on every sample.
func TestCountGeoJSONAgreesWithDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	samples := 20000
	if testing.Short() {
		samples = 2000
	}
	ok := 0
	for range samples {
		g := &geoJSONGen{r: r}
		g.geometry(1)
		data := g.b
		dg, decErr := cost.Decode(data)
		n, countErr := cost.CountPayload(data)
		if (decErr == nil) != (countErr == nil) {
			t.Fatalf("%s\nDecode error %v, CountPayload error %v", data, decErr, countErr)
		}
		if decErr != nil {
			if !errors.Is(countErr, cost.ErrMalformed) || !errors.Is(decErr, cost.ErrMalformed) {
				t.Fatalf("%s\nDecode error %v, CountPayload error %v", data, decErr, countErr)
			}
			continue
		}
		ok++
		if v := cost.Vertices(dg); v != n {
			t.Fatalf("%s\nCountPayload %d, Vertices(Decode) %d", data, n, v)
		}
	}
	// The generator should produce plenty of both.
	if ok < samples/5 || ok > samples*9/10 {
		t.Errorf("%d of %d samples decoded; the generator needs tuning", ok, samples)
	}
}
