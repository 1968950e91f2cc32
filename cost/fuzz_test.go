package cost_test

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/twpayne/go-geom"

	"github.com/spillway-go/spillway/cost"
)

// FuzzDecode checks that Decode and CountPayload never panic, never allocate
// far beyond the input, fail with one of the documented sentinels, and agree:
// both succeed or both fail, and CountPayload equals Vertices(Decode). Binary
// input is also compared with go-geom's own decoders.
func FuzzDecode(f *testing.F) {
	// Small real features, as GeoJSON and in every binary form.
	features := [][]byte{
		readLines(f, countriesFile)[31],  // Malta, a small polygon
		readLines(f, countiesFile)[1050], // a small county polygon
	}
	for _, line := range features {
		f.Add(line)
		g := decodeFeature(f, line)
		w := mustWKB(f, g, binary.LittleEndian)
		e := mustEWKB(f, withSRID(f, g, 4326), binary.BigEndian)
		f.Add(w)
		f.Add(e)
		f.Add([]byte(hex.EncodeToString(e)))
		f.Add(w[:len(w)/2])
	}
	// A tiny multi-polygon and collection, small enough for the fuzzer to
	// mutate structurally.
	f.Add([]byte(`{"type":"FeatureCollection","features":[{"type":"Feature","geometry":null},` +
		`{"type":"Feature","geometry":{"type":"MultiPolygon","coordinates":[[[[0,0],[1,0],[0,1],[0,0]]]]}}]}`))
	f.Add([]byte(`{"type":"GeometryCollection","geometries":[{"type":"Point","coordinates":[1,2,3]},{"type":"MultiPoint","coordinates":[]}]}`))
	f.Add([]byte(`{"type":"MultiPoint","coordinates":[[1,2],null,[3,4]]}`)) // go-geom reads null as an empty point
	f.Add([]byte(`{"type":"Polygon","coordinates":[[],[[1,2],[3,4]],null]}`))
	f.Add([]byte(`{"type":"LineString","coordinates":[[1e-400,null],[1.5E+3,-0]]}`))
	f.Add(newWKB().header(7).u32(2).header(1).f64(1, 2).header(1005).u32(1).header(1002).u32(1).f64(1, 2, 3).bytes())
	f.Add(newWKB().header(6|0x20000000).u32(4326).u32(1).header(3).u32(1).u32(1).f64(0, 0).bytes())
	f.Add(newWKB().header(4).u32(1).header(1).f64(0, 0).bytes())
	// Random small trees of every kind, layout and dialect.
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 12 {
		g := &wkbGen{r: r, ewkb: i%2 == 1}
		w := newWKB()
		g.geometry(w, 1, 4+i%4, i%len(layouts))
		f.Add(w.bytes())
	}
	// Hostile and garbage input.
	f.Add(newWKB().header(2).u32(0x7FFFFFFF).f64(1, 2).bytes())
	f.Add(newWKB().header(3).u32(0xFFFFFFFF).bytes())
	f.Add(nestedWKB(40))
	f.Add(nestedGeoJSON(40))
	f.Add([]byte{})
	f.Add([]byte("   "))
	f.Add([]byte("garbage"))
	f.Add([]byte{0x01, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("0101000000"))
	f.Add([]byte(`{"type":"Point","coordinates":[1,2,3,4,5,6]}`))

	limitGoGeom(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		compareWithGoGeom(t, data)
		var (
			g          geom.T
			n          int
			decErr     error
			countErr   error
			sentinels  = []error{cost.ErrEmptyPayload, cost.ErrUnknownFormat, cost.ErrMalformed, cost.ErrTooLarge}
			allowBytes = 1<<20 + 256*uint64(len(data))
		)
		allocated := allocatedBy(func() {
			g, decErr = cost.Decode(data)
			n, countErr = cost.CountPayload(data)
		})
		if allocated > allowBytes {
			t.Fatalf("allocated %d bytes for a %d-byte payload", allocated, len(data))
		}
		if (decErr == nil) != (countErr == nil) {
			t.Fatalf("Decode error %v, CountPayload error %v", decErr, countErr)
		}
		if decErr != nil {
			for _, s := range sentinels {
				if errors.Is(decErr, s) != errors.Is(countErr, s) {
					t.Fatalf("Decode error %v, CountPayload error %v", decErr, countErr)
				}
			}
			for _, err := range []error{decErr, countErr} {
				if !isAny(err, sentinels) {
					t.Fatalf("error %v wraps none of the sentinels", err)
				}
				if strings.Contains(err.Error(), "panicked") {
					t.Fatalf("go-geom panicked: %v", err)
				}
			}
			if g != nil || n != 0 {
				t.Fatalf("results %T, %d returned with errors", g, n)
			}
			return
		}
		if g == nil {
			t.Fatal("Decode returned neither a geometry nor an error")
		}
		if v := cost.Vertices(g); v != n {
			t.Fatalf("CountPayload = %d, Vertices(Decode) = %d", n, v)
		}
		if n < 0 {
			t.Fatalf("negative count %d", n)
		}
	})
}

func isAny(err error, targets []error) bool {
	for _, target := range targets {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// FuzzParseCount checks ParseCount against strconv.ParseInt: a count is
// trusted exactly when it is a plain, optionally '+'-prefixed, base-10 int64
// that is not negative and not zero for a non-empty payload.
func FuzzParseCount(f *testing.F) {
	for _, v := range []string{"", "0", "+0", "12", "+12", "-1", "1.5", " 12", "12 ", "++1", "+-1",
		"007", "9223372036854775807", "9223372036854775808", "00000000000000000000001", "abc", "1e3", "0x1F", "1_0"} {
		f.Add(v, 0)
		f.Add(v, 100)
	}
	f.Fuzz(func(t *testing.T, value string, payloadLen int) {
		n, src := cost.ParseCount(value, payloadLen)
		switch src {
		case cost.SourceHeader, cost.SourceMissing, cost.SourceMalformed:
		default:
			t.Fatalf("ParseCount(%q, %d) reported source %v", value, payloadLen, src)
		}
		if (value == "") != (src == cost.SourceMissing) {
			t.Fatalf("ParseCount(%q, %d): source %v", value, payloadLen, src)
		}
		if src != cost.SourceHeader && n != 0 {
			t.Fatalf("ParseCount(%q, %d) = %d with source %v", value, payloadLen, n, src)
		}
		trimmed := strings.TrimPrefix(value, "+")
		v, err := strconv.ParseInt(trimmed, 10, 64)
		if src == cost.SourceHeader {
			if err != nil {
				t.Fatalf("ParseCount(%q, %d) trusted a value strconv rejects: %v", value, payloadLen, err)
			}
			if v != n || v < 0 || (v == 0 && payloadLen > 0) {
				t.Fatalf("ParseCount(%q, %d) = %d, strconv says %d", value, payloadLen, n, v)
			}
		}
		// And the converse: every plain usable count is trusted.
		plain := trimmed != "" && trimmed[0] != '+' && trimmed[0] != '-'
		if err == nil && plain && v >= 0 && (v > 0 || payloadLen <= 0) && (src != cost.SourceHeader || n != v) {
			t.Fatalf("ParseCount(%q, %d) = %d, %v; strconv reads a usable %d", value, payloadLen, n, src, v)
		}
	})
}
