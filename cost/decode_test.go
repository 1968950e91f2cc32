package cost_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/encoding/wkb"
	"github.com/twpayne/go-geom/encoding/wkbcommon"

	"github.com/spillway-go/spillway/cost"
)

func TestCountPayloadRealData(t *testing.T) {
	tests := []struct {
		file          string
		features, sum int
	}{
		{countriesFile, 220, 71129},
		{countiesFile, 3231, 68313},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			lines := readLines(t, tt.file)
			if len(lines) != tt.features {
				t.Fatalf("%d features, want %d", len(lines), tt.features)
			}
			sum := 0
			for i, line := range lines {
				n, err := cost.CountPayload(line)
				if err != nil {
					t.Fatalf("feature %d: %v", i, err)
				}
				if n <= 0 {
					t.Fatalf("feature %d: %d vertices", i, n)
				}
				sum += n
			}
			if sum != tt.sum {
				t.Errorf("total %d vertices, want %d", sum, tt.sum)
			}
		})
	}
}

// TestRoundTripBinary re-encodes every real feature as WKB (both byte
// orders), EWKB with SRID 4326 and hex EWKB and checks that all count the
// same as the GeoJSON.
func TestRoundTripBinary(t *testing.T) {
	for _, file := range []string{countriesFile, countiesFile} {
		t.Run(file, func(t *testing.T) {
			for i, line := range readLines(t, file) {
				want, err := cost.CountPayload(line)
				if err != nil {
					t.Fatalf("feature %d: %v", i, err)
				}
				g := decodeFeature(t, line)
				if got := cost.Vertices(g); got != want {
					t.Fatalf("feature %d: Vertices(Decode) = %d, CountPayload = %d", i, got, want)
				}
				ewkbBytes := mustEWKB(t, withSRID(t, g, 4326), binary.LittleEndian)
				encodings := map[string][]byte{
					"wkb ndr":  mustWKB(t, g, binary.LittleEndian),
					"wkb xdr":  mustWKB(t, g, binary.BigEndian),
					"ewkb ndr": ewkbBytes,
					"ewkb xdr": mustEWKB(t, withSRID(t, g, 4326), binary.BigEndian),
				}
				if i%50 == 0 { // hex doubles the size; a sample is enough
					encodings["ewkb hex"] = []byte(hex.EncodeToString(ewkbBytes))
				}
				for name, payload := range encodings {
					got, err := cost.CountPayload(payload)
					if err != nil {
						t.Fatalf("feature %d %s: %v", i, name, err)
					}
					if got != want {
						t.Fatalf("feature %d %s: %d vertices, GeoJSON has %d", i, name, got, want)
					}
					dg, err := cost.Decode(payload)
					if err != nil {
						t.Fatalf("feature %d %s: Decode: %v", i, name, err)
					}
					if got := cost.Vertices(dg); got != want {
						t.Fatalf("feature %d %s: Vertices(Decode) = %d, want %d", i, name, got, want)
					}
					if strings.HasPrefix(name, "ewkb") && dg.SRID() != 4326 {
						t.Fatalf("feature %d %s: SRID %d, want 4326", i, name, dg.SRID())
					}
				}
			}
		})
	}
}

func TestFeatureCollection(t *testing.T) {
	lines := readLines(t, countriesFile)[:12]
	want := 0
	for _, l := range lines {
		n, err := cost.CountPayload(l)
		if err != nil {
			t.Fatal(err)
		}
		want += n
	}
	nullFeature := []byte(`{"type":"Feature","properties":{"name":"unlocated"},"geometry":null}`)
	all := append(append([][]byte{}, lines...), nullFeature)
	fc := []byte(`{"type":"FeatureCollection","features":[` + string(bytes.Join(all, []byte(","))) + `]}`)

	got, err := cost.CountPayload(fc)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("FeatureCollection: %d vertices, want the sum of its features %d", got, want)
	}
	g, err := cost.Decode(fc)
	if err != nil {
		t.Fatal(err)
	}
	gc, ok := g.(*geom.GeometryCollection)
	if !ok {
		t.Fatalf("Decode(FeatureCollection) is a %T, want *geom.GeometryCollection", g)
	}
	if gc.NumGeoms() != len(all) {
		t.Errorf("%d geometries, want one per feature (%d)", gc.NumGeoms(), len(all))
	}
	// The collection round-trips through EWKB too.
	if n, err := cost.CountPayload(mustEWKB(t, gc, binary.LittleEndian)); err != nil || n != want {
		t.Errorf("EWKB of the collection: %d, %v; want %d", n, err, want)
	}

	empty := []byte(`{"type":"FeatureCollection","features":[]}`)
	if n, err := cost.CountPayload(empty); err != nil || n != 0 {
		t.Errorf("empty FeatureCollection: %d, %v", n, err)
	}
}

func TestDecodeGeoJSON(t *testing.T) {
	tests := []struct {
		name, json string
		want       int
		wantType   string
	}{
		{"point", `{"type":"Point","coordinates":[1,2]}`, 1, "*geom.Point"},
		{"point XYZ", `{"type":"Point","coordinates":[1,2,3]}`, 1, "*geom.Point"},
		{"point empty coordinates", `{"type":"Point","coordinates":[]}`, 0, "*geom.Point"},
		{"point null coordinates", `{"type":"Point","coordinates":null}`, 0, "*geom.Point"},
		{"point without coordinates", `{"type":"Point"}`, 0, "*geom.Point"},
		{"linestring", `{"type":"LineString","coordinates":[[0,0],[1,1],[2,0]]}`, 3, "*geom.LineString"},
		{"polygon with hole", `{"type":"Polygon","coordinates":[[[0,0],[4,0],[4,4],[0,0]],[[1,1],[2,1],[1,2],[1,1]]]}`, 8, "*geom.Polygon"},
		{"multipoint", `{"type":"MultiPoint","coordinates":[[0,0],[1,1]]}`, 2, "*geom.MultiPoint"},
		{"multilinestring", `{"type":"MultiLineString","coordinates":[[[0,0],[1,1]],[[2,2],[3,3],[4,4]]]}`, 5, "*geom.MultiLineString"},
		{"multipolygon", `{"type":"MultiPolygon","coordinates":[[[[0,0],[1,0],[1,1],[0,0]]],[[[5,5],[6,5],[6,6],[5,5]]]]}`, 8, "*geom.MultiPolygon"},
		{"collection", `{"type":"GeometryCollection","geometries":[{"type":"Point","coordinates":[1,2]},
			{"type":"GeometryCollection","geometries":[{"type":"LineString","coordinates":[[0,0],[1,1]]}]}]}`, 3, "*geom.GeometryCollection"},
		{"collection empty", `{"type":"GeometryCollection","geometries":[]}`, 0, "*geom.GeometryCollection"},
		{"feature", `{"type":"Feature","id":7,"properties":{"a":[1,{"b":null}]},"geometry":{"type":"Point","coordinates":[1,2]}}`, 1, "*geom.Point"},
		{"feature null geometry", `{"type":"Feature","properties":null,"geometry":null}`, 0, "*geom.GeometryCollection"},
		{"feature with odd id and bbox", `{"type":"Feature","id":{"x":[true]},"bbox":[1,2,3],"geometry":{"type":"Point","coordinates":[1,2]}}`, 1, "*geom.Point"},
		// go-geom's coordinate rules, which the counting scanner mirrors.
		{"multipoint with a null (empty) point", `{"type":"MultiPoint","coordinates":[[1,2],null,[3,4]]}`, 2, "*geom.MultiPoint"},
		{"polygon with an empty first ring is XY", `{"type":"Polygon","coordinates":[[],[[1,2],[3,4]]]}`, 2, "*geom.Polygon"},
		{"polygon with a null ring", `{"type":"Polygon","coordinates":[[[1,2,3]],null]}`, 1, "*geom.Polygon"},
		{"multipolygon with an empty first polygon", `{"type":"MultiPolygon","coordinates":[[],[[[1,2]]]]}`, 1, "*geom.MultiPolygon"},
		{"null ordinates are zero", `{"type":"Point","coordinates":[null,null]}`, 1, "*geom.Point"},
		{"underflow is zero", `{"type":"LineString","coordinates":[[1e-400,2],[3,4]]}`, 2, "*geom.LineString"},
		{"five ordinates", `{"type":"LineString","coordinates":[[1,2,3,4,5],[1,2,3,4,5]]}`, 2, "*geom.LineString"},
		{"linestring null coordinates", `{"type":"LineString","coordinates":null}`, 0, "*geom.LineString"},
		{"whitespace and BOM", "\xEF\xBB\xBF \r\n\t{\"type\":\"Point\",\"coordinates\":[1,2]}\n ", 1, "*geom.Point"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := cost.Decode([]byte(tt.json))
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprintf("%T", g); got != tt.wantType {
				t.Errorf("Decode returned %s, want %s", got, tt.wantType)
			}
			if got := cost.Vertices(g); got != tt.want {
				t.Errorf("Vertices = %d, want %d", got, tt.want)
			}
			if n, err := cost.CountPayload([]byte(tt.json)); err != nil || n != tt.want {
				t.Errorf("CountPayload = %d, %v; want %d", n, err, tt.want)
			}
		})
	}
}

func TestDecodeWKBVariants(t *testing.T) {
	const srid = 4326
	nan := math.Float64frombits(geom.PointEmptyCoordHex)
	tests := []struct {
		name    string
		payload []byte
		want    int
	}{
		{"wkb point", newWKB().header(1).f64(1, 2).bytes(), 1},
		{"wkb point big endian", newWKBBigEndian().header(1).f64(1, 2).bytes(), 1},
		{"wkb point Z (ISO 1001)", newWKB().header(1001).f64(1, 2, 3).bytes(), 1},
		{"wkb point M (ISO 2001)", newWKB().header(2001).f64(1, 2, 3).bytes(), 1},
		{"wkb point ZM (ISO 3001)", newWKB().header(3001).f64(1, 2, 3, 4).bytes(), 1},
		{"wkb empty point (NaN)", newWKB().header(1).f64(nan, nan).bytes(), 0},
		{"wkb point with one NaN is not empty", newWKB().header(1).f64(nan, 2).bytes(), 1},
		{"wkb linestring", newWKB().header(2).u32(3).f64(0, 0, 1, 1, 2, 2).bytes(), 3},
		{"wkb linestring empty", newWKB().header(2).u32(0).bytes(), 0},
		{"wkb polygon 2 rings", newWKB().header(3).u32(2).u32(2).f64(0, 0, 1, 1).u32(1).f64(5, 5).bytes(), 3},
		{"wkb polygon no rings", newWKB().header(3).u32(0).bytes(), 0},
		{"wkb multipoint with empty point", newWKB().header(4).u32(2).
			header(1).f64(1, 2).header(1).f64(nan, nan).bytes(), 1},
		{"wkb multipoint mixed byte order", newWKB().header(4).u32(2).
			header(1).f64(1, 2).raw(newWKBBigEndian().header(1).f64(3, 4).bytes()...).bytes(), 2},
		{"wkb multilinestring", newWKB().header(5).u32(2).
			header(2).u32(2).f64(0, 0, 1, 1).header(2).u32(1).f64(9, 9).bytes(), 3},
		{"wkb multipolygon Z", newWKB().header(1006).u32(1).
			header(1003).u32(1).u32(2).f64(0, 0, 0, 1, 1, 1).bytes(), 2},
		{"wkb collection mixed layouts", newWKB().header(7).u32(3).
			header(1).f64(1, 2).header(1001).f64(1, 2, 3).header(7).u32(0).bytes(), 2},
		{"wkb collection empty", newWKB().header(7).u32(0).bytes(), 0},
		{"ewkb point SRID", newWKB().header(1|0x20000000).u32(srid).f64(1, 2).bytes(), 1},
		{"ewkb point Z", newWKB().header(1|0x80000000).f64(1, 2, 3).bytes(), 1},
		{"ewkb point M", newWKB().header(1|0x40000000).f64(1, 2, 3).bytes(), 1},
		{"ewkb point ZM SRID big endian", newWKBBigEndian().header(1|0xE0000000).u32(srid).f64(1, 2, 3, 4).bytes(), 1},
		{"ewkb empty point", newWKB().header(1|0x20000000).u32(srid).f64(nan, nan).bytes(), 0},
		{"ewkb linestring Z SRID", newWKB().header(2|0xA0000000).u32(srid).u32(2).f64(0, 0, 0, 1, 1, 1).bytes(), 2},
		{"ewkb collection with SRID member", newWKB().header(7|0x20000000).u32(srid).u32(1).
			header(2|0x20000000).u32(srid).u32(1).f64(0, 0).bytes(), 1},
		{"hex wkb lower", []byte(hex.EncodeToString(newWKB().header(2).u32(2).f64(0, 0, 1, 1).bytes())), 2},
		{"hex ewkb upper with whitespace", []byte("  " + strings.ToUpper(hex.EncodeToString(
			newWKB().header(2|0x20000000).u32(srid).u32(2).f64(0, 0, 1, 1).bytes())) + "\n"), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := cost.Decode(tt.payload)
			if err != nil {
				t.Fatal(err)
			}
			if got := cost.Vertices(g); got != tt.want {
				t.Errorf("Vertices(Decode) = %d, want %d", got, tt.want)
			}
			n, err := cost.CountPayload(tt.payload)
			if err != nil || n != tt.want {
				t.Errorf("CountPayload = %d, %v; want %d", n, err, tt.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	valid := newWKB().header(2).u32(2).f64(0, 0, 1, 1).bytes()
	tests := []struct {
		name    string
		payload []byte
		want    error
	}{
		{"nil", nil, cost.ErrEmptyPayload},
		{"empty", []byte{}, cost.ErrEmptyPayload},
		{"whitespace", []byte(" \t\r\n "), cost.ErrEmptyPayload},
		{"BOM only", []byte("\xEF\xBB\xBF"), cost.ErrEmptyPayload},
		{"garbage", []byte("garbage"), cost.ErrUnknownFormat},
		{"binary garbage", []byte{0xFF, 0xFE, 0x00}, cost.ErrUnknownFormat},
		{"WKT", []byte("POINT (1 2)"), cost.ErrUnknownFormat},
		{"WKT starting with a hex letter", []byte("CIRCULARSTRING(0 0, 1 1, 2 0)"), cost.ErrUnknownFormat},
		{"JSON array", []byte("[1,2]"), cost.ErrUnknownFormat},
		{"JSON object without type", []byte(`{"coordinates":[1,2]}`), cost.ErrUnknownFormat},
		{"JSON object of another type", []byte(`{"type":"Topology","objects":{}}`), cost.ErrUnknownFormat},
		{"hex not WKB", []byte("deadbeef"), cost.ErrUnknownFormat},
		{"number", []byte("12"), cost.ErrUnknownFormat},

		{"invalid JSON", []byte(`{"type":"Point",`), cost.ErrMalformed},
		{"trailing JSON", []byte(`{"type":"Point","coordinates":[1,2]} {}`), cost.ErrMalformed},
		{"coordinates not numbers", []byte(`{"type":"Point","coordinates":["a","b"]}`), cost.ErrMalformed},
		{"coordinates of one dimension", []byte(`{"type":"Point","coordinates":[1]}`), cost.ErrMalformed},
		{"mixed dimensions", []byte(`{"type":"LineString","coordinates":[[1,2],[1,2,3]]}`), cost.ErrMalformed},
		{"number out of range", []byte(`{"type":"Point","coordinates":[1e999,2]}`), cost.ErrMalformed},
		{"long number out of range", []byte(`{"type":"Point","coordinates":[` + strings.Repeat("9", 400) + `,2]}`), cost.ErrMalformed},
		{"multipoint starting with null", []byte(`{"type":"MultiPoint","coordinates":[null,[1,2]]}`), cost.ErrMalformed},
		{"multipoint with empty array point", []byte(`{"type":"MultiPoint","coordinates":[[1,2],[]]}`), cost.ErrMalformed},
		{"linestring with null position", []byte(`{"type":"LineString","coordinates":[[1,2],null]}`), cost.ErrMalformed},
		{"polygon XY after an empty ring", []byte(`{"type":"Polygon","coordinates":[[],[[1,2,3]]]}`), cost.ErrMalformed},
		{"coordinates too deep", []byte(`{"type":"LineString","coordinates":[[[1,2]]]}`), cost.ErrMalformed},
		{"coordinates too shallow", []byte(`{"type":"Polygon","coordinates":[[1,2]]}`), cost.ErrMalformed},
		{"coordinates not an array", []byte(`{"type":"MultiPolygon","coordinates":{}}`), cost.ErrMalformed},
		{"ordinate is a string", []byte(`{"type":"MultiPolygon","coordinates":[[[[1,"2"]]]]}`), cost.ErrMalformed},
		{"feature without geometry member", []byte(`{"type":"Feature","properties":{}}`), cost.ErrMalformed},
		{"feature geometry without type", []byte(`{"type":"Feature","geometry":{"coordinates":[1,2]}}`), cost.ErrMalformed},
		{"feature geometry not an object", []byte(`{"type":"Feature","geometry":[1,2]}`), cost.ErrMalformed},
		{"feature with bad geometry", []byte(`{"type":"Feature","geometry":{"type":"Circle"}}`), cost.ErrMalformed},
		{"feature collection without features", []byte(`{"type":"FeatureCollection"}`), cost.ErrMalformed},
		{"feature collection with null feature", []byte(`{"type":"FeatureCollection","features":[null]}`), cost.ErrMalformed},
		{"feature collection with a geometry as feature", []byte(`{"type":"FeatureCollection","features":[{"type":"Point","coordinates":[1,2]}]}`), cost.ErrMalformed},
		{"feature collection with feature without geometry", []byte(`{"type":"FeatureCollection","features":[{"type":"Feature"}]}`), cost.ErrMalformed},
		{"collection with null member", []byte(`{"type":"GeometryCollection","geometries":[null]}`), cost.ErrMalformed},
		{"collection holding a feature", []byte(`{"type":"GeometryCollection","geometries":[{"type":"Feature","geometry":null}]}`), cost.ErrMalformed},

		{"wkb only byte order", []byte{1}, cost.ErrMalformed},
		{"wkb truncated header", []byte{1, 2, 0}, cost.ErrMalformed},
		{"wkb truncated point", newWKB().header(1).f64(1).bytes(), cost.ErrMalformed},
		{"wkb truncated linestring", valid[:len(valid)-1], cost.ErrMalformed},
		{"wkb trailing byte", append(append([]byte{}, valid...), 0), cost.ErrMalformed},
		{"wkb unknown type", newWKB().header(99).bytes(), cost.ErrMalformed},
		{"wkb type 0", newWKB().header(0).u32(0).bytes(), cost.ErrMalformed},
		{"wkb triangle", newWKB().header(17).u32(0).bytes(), cost.ErrMalformed},
		{"wkb dimension 4000", newWKB().header(4001).f64(1, 2).bytes(), cost.ErrMalformed},
		{"wkb ISO code read as EWKB member", newWKB().header(7|0x20000000).u32(4326).u32(1).header(1001).f64(1, 2, 3).bytes(), cost.ErrMalformed},
		{"ewkb unknown flag", newWKB().header(1|0x10000000|0x20000000).u32(4326).f64(1, 2).bytes(), cost.ErrMalformed},
		{"ewkb truncated SRID", newWKB().header(1|0x20000000).raw(1, 2).bytes(), cost.ErrMalformed},
		{"multipoint holding a linestring", newWKB().header(4).u32(1).header(2).u32(0).bytes(), cost.ErrMalformed},
		{"multipoint with layout mismatch", newWKB().header(4).u32(1).header(1001).f64(1, 2, 3).bytes(), cost.ErrMalformed},
		{"multilinestring holding a point", newWKB().header(5).u32(1).header(1).f64(1, 2).bytes(), cost.ErrMalformed},
		{"multipolygon holding a linestring", newWKB().header(6).u32(1).header(2).u32(0).bytes(), cost.ErrMalformed},
		{"member with bad byte order", newWKB().header(7).u32(1).raw(7, 1, 0, 0, 0).f64(1, 2).bytes(), cost.ErrMalformed},
		{"hex odd length", []byte("0101000000000"), cost.ErrMalformed},
		{"hex truncated", []byte(hex.EncodeToString(valid[:10])), cost.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := cost.Decode(tt.payload)
			if !errors.Is(err, tt.want) {
				t.Errorf("Decode error = %v, want %v", err, tt.want)
			}
			if g != nil {
				t.Errorf("Decode returned %T with an error", g)
			}
			n, err := cost.CountPayload(tt.payload)
			if !errors.Is(err, tt.want) {
				t.Errorf("CountPayload error = %v, want %v", err, tt.want)
			}
			if n != 0 {
				t.Errorf("CountPayload = %d with an error", n)
			}
		})
	}
}

// TestDecodeEveryPrefix cuts real WKB and EWKB at every length: each proper
// prefix is malformed, never a panic or a smaller geometry.
func TestDecodeEveryPrefix(t *testing.T) {
	line := readLines(t, countiesFile)[1050] // a small polygon
	g := decodeFeature(t, line)
	for name, full := range map[string][]byte{
		"wkb":  mustWKB(t, g, binary.LittleEndian),
		"ewkb": mustEWKB(t, withSRID(t, g, 4326), binary.BigEndian),
	} {
		for i := 1; i < len(full); i++ {
			if _, err := cost.CountPayload(full[:i]); !errors.Is(err, cost.ErrMalformed) {
				t.Fatalf("%s prefix of %d/%d bytes: CountPayload error %v", name, i, len(full), err)
			}
			if _, err := cost.Decode(full[:i]); !errors.Is(err, cost.ErrMalformed) {
				t.Fatalf("%s prefix of %d/%d bytes: Decode error %v", name, i, len(full), err)
			}
		}
	}
}

// allocatedBy returns the bytes allocated while f runs.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHugeDeclaredCounts feeds tiny payloads that declare absurd element
// counts. go-geom alone would try to allocate gigabytes for them.
func TestHugeDeclaredCounts(t *testing.T) {
	const huge = math.MaxInt32
	tests := []struct {
		name    string
		payload []byte
	}{
		{"linestring points", newWKB().header(2).u32(huge).f64(1, 2).bytes()},
		{"linestring points 2^32-1 XYZM", newWKB().header(3002).u32(math.MaxUint32).f64(1, 2).bytes()},
		{"polygon rings", newWKB().header(3).u32(huge).u32(0).bytes()},
		{"polygon ring points", newWKB().header(3).u32(1).u32(huge).f64(1, 2).bytes()},
		{"multipoint members", newWKB().header(4).u32(huge).header(1).f64(1, 2).bytes()},
		{"multilinestring members", newWKB().header(5).u32(huge).bytes()},
		{"multipolygon members", newWKB().header(6).u32(huge).bytes()},
		{"collection members", newWKB().header(7).u32(huge).bytes()},
		{"ewkb linestring points", newWKB().header(2|0xE0000000).u32(4326).u32(huge).f64(1, 2).bytes()},
		{"ewkb collection members", newWKBBigEndian().header(7 | 0x20000000).u32(4326).u32(huge).bytes()},
		{"nested declared counts", newWKB().header(7).u32(1).header(6).u32(1).header(3).u32(1).u32(huge).bytes()},
		{"hex linestring points", []byte(hex.EncodeToString(newWKB().header(2).u32(huge).f64(1, 2).bytes()))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.payload) > 64 {
				t.Fatalf("payload is %d bytes; the point is a tiny one", len(tt.payload))
			}
			var decErr, countErr error
			allocated := allocatedBy(func() {
				_, decErr = cost.Decode(tt.payload)
				_, countErr = cost.CountPayload(tt.payload)
			})
			for _, err := range []error{decErr, countErr} {
				if !errors.Is(err, cost.ErrMalformed) && !errors.Is(err, cost.ErrTooLarge) {
					t.Errorf("error %v, want ErrMalformed or ErrTooLarge", err)
				}
			}
			if allocated > 1<<20 {
				t.Errorf("allocated %d bytes for a %d-byte payload", allocated, len(tt.payload))
			}
			allocs := testing.AllocsPerRun(10, func() { _, _ = cost.CountPayload(tt.payload) })
			if allocs > 20 {
				t.Errorf("CountPayload made %.0f allocations", allocs)
			}
		})
	}
}

// TestGoGeomLimits checks that go-geom's own element limits, if an
// application sets them, surface as ErrTooLarge from both entry points.
func TestGoGeomLimits(t *testing.T) {
	saved := wkbcommon.MaxGeometryElements
	t.Cleanup(func() { wkbcommon.MaxGeometryElements = saved })
	wkbcommon.MaxGeometryElements = [4]int{0, 2, 2, 2}

	payload := newWKB().header(2).u32(3).f64(0, 0, 1, 1, 2, 2).bytes()
	if _, err := cost.CountPayload(payload); !errors.Is(err, cost.ErrTooLarge) {
		t.Errorf("CountPayload: %v, want ErrTooLarge", err)
	}
	if _, err := cost.Decode(payload); !errors.Is(err, cost.ErrTooLarge) {
		t.Errorf("Decode: %v, want ErrTooLarge", err)
	}
	ok := newWKB().header(2).u32(2).f64(0, 0, 1, 1).bytes()
	if n, err := cost.CountPayload(ok); err != nil || n != 2 {
		t.Errorf("within the limit: %d, %v", n, err)
	}
}

// nestedWKB returns depth collections nested in each other around a point.
func nestedWKB(depth int) []byte {
	w := newWKB()
	for range depth {
		w.header(7).u32(1)
	}
	return w.header(1).f64(1, 2).bytes()
}

// nestedGeoJSON returns depth collections nested in each other around a
// point.
func nestedGeoJSON(depth int) []byte {
	var b strings.Builder
	for range depth {
		b.WriteString(`{"type":"GeometryCollection","geometries":[`)
	}
	b.WriteString(`{"type":"Point","coordinates":[1,2]}`)
	for range depth {
		b.WriteString(`]}`)
	}
	return []byte(b.String())
}

func TestNestingDepth(t *testing.T) {
	// The point itself is one level.
	atLimit := cost.MaxNestingDepth - 1
	for name, payload := range map[string][]byte{
		"wkb":     nestedWKB(atLimit),
		"geojson": nestedGeoJSON(atLimit),
		// Members of a multi-geometry are one level deeper, so an empty one
		// fits where a non-empty one does not.
		"wkb empty multi": append(bytes.Repeat(newWKB().header(7).u32(1).bytes(), atLimit), newWKB().header(6).u32(0).bytes()...),
		"geojson empty multi": []byte(strings.Replace(string(nestedGeoJSON(atLimit)),
			`"Point","coordinates":[1,2]`, `"MultiPoint","coordinates":[]`, 1)),
	} {
		if name == "wkb empty multi" || name == "geojson empty multi" {
			if n, err := cost.CountPayload(payload); err != nil || n != 0 {
				t.Errorf("%s at the depth limit: %d, %v", name, n, err)
			}
			continue
		}
		if n, err := cost.CountPayload(payload); err != nil || n != 1 {
			t.Errorf("%s at the depth limit: %d, %v", name, n, err)
		}
	}
	for name, payload := range map[string][]byte{
		"wkb one too deep":           nestedWKB(atLimit + 1),
		"geojson one too deep":       nestedGeoJSON(atLimit + 1),
		"wkb 1,000,000 deep":         nestedWKB(1_000_000),
		"ewkb 1,000,000 deep":        append(newWKB().header(7|0x20000000).u32(4326).u32(1).bytes(), nestedWKB(1_000_000)...),
		"geojson 4,000 deep":         nestedGeoJSON(4000),
		"multipolygon at the limit":  append(bytes.Repeat(newWKB().header(7).u32(1).bytes(), atLimit), newWKB().header(6).u32(1).header(3).u32(0).bytes()...),
		"geojson multi at the limit": []byte(strings.Replace(string(nestedGeoJSON(atLimit)), `"Point","coordinates":[1,2]`, `"MultiPoint","coordinates":[[1,2]]`, 1)),
	} {
		for fn, f := range map[string]func([]byte) error{
			"Decode":       func(b []byte) error { _, err := cost.Decode(b); return err },
			"CountPayload": func(b []byte) error { _, err := cost.CountPayload(b); return err },
		} {
			if err := f(payload); !errors.Is(err, cost.ErrTooLarge) {
				t.Errorf("%s %s: %v, want ErrTooLarge", name, fn, err)
			}
		}
	}
	// JSON deeper than encoding/json allows is malformed, not a crash.
	deepJSON := []byte(`{"type":"Feature","geometry":null,"properties":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`)
	if _, err := cost.Decode(deepJSON); !errors.Is(err, cost.ErrMalformed) {
		t.Errorf("JSON nested 20,000 deep: %v, want ErrMalformed", err)
	}
}

func TestMaxPayloadBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates MaxPayloadBytes")
	}
	big := make([]byte, cost.MaxPayloadBytes+1)
	big[0] = 1
	if _, err := cost.CountPayload(big); !errors.Is(err, cost.ErrTooLarge) {
		t.Errorf("CountPayload: %v, want ErrTooLarge", err)
	}
	if _, err := cost.Decode(big); !errors.Is(err, cost.ErrTooLarge) {
		t.Errorf("Decode: %v, want ErrTooLarge", err)
	}
}

// TestWKBEmptyPointAgreesWithGoGeom pins the empty-point convention against
// go-geom's own encoder: an empty point written as WKB or EWKB reads back as
// zero vertices.
func TestWKBEmptyPointAgreesWithGoGeom(t *testing.T) {
	empty := geom.NewPointEmpty(geom.XY)
	b, err := wkb.Marshal(empty, wkb.NDR, wkbcommon.WKBOptionEmptyPointHandling(wkbcommon.EmptyPointHandlingNaN))
	if err != nil {
		t.Fatal(err)
	}
	for name, payload := range map[string][]byte{"wkb": b, "ewkb": mustEWKB(t, empty, binary.LittleEndian)} {
		if n, err := cost.CountPayload(payload); err != nil || n != 0 {
			t.Errorf("%s empty point: %d, %v", name, n, err)
		}
	}
}
