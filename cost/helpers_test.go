package cost_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"testing"

	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/encoding/ewkb"
	"github.com/twpayne/go-geom/encoding/wkb"

	"github.com/spillway-go/spillway/cost"
)

const (
	countriesFile = "../testdata/countries-land-10km.ndjson"
	countiesFile  = "../testdata/us-counties-10m.ndjson"
)

// readLines returns the non-empty lines of a testdata file; each is one
// GeoJSON Feature.
func readLines(tb testing.TB, name string) [][]byte {
	tb.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		tb.Fatalf("reading %s: %v", name, err)
	}
	var lines [][]byte
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) > 0 {
			lines = append(lines, line)
		}
	}
	return lines
}

// decodeFeature decodes one GeoJSON feature line.
func decodeFeature(tb testing.TB, line []byte) geom.T {
	tb.Helper()
	g, err := cost.Decode(line)
	if err != nil {
		tb.Fatalf("decoding feature: %v", err)
	}
	return g
}

func mustWKB(tb testing.TB, g geom.T, order binary.ByteOrder) []byte {
	tb.Helper()
	b, err := wkb.Marshal(g, order)
	if err != nil {
		tb.Fatalf("wkb.Marshal: %v", err)
	}
	return b
}

func mustEWKB(tb testing.TB, g geom.T, order binary.ByteOrder) []byte {
	tb.Helper()
	b, err := ewkb.Marshal(g, order)
	if err != nil {
		tb.Fatalf("ewkb.Marshal: %v", err)
	}
	return b
}

// withSRID returns g with its SRID set, for the types the test data holds.
func withSRID(tb testing.TB, g geom.T, srid int) geom.T {
	tb.Helper()
	switch g := g.(type) {
	case *geom.Point:
		return g.SetSRID(srid)
	case *geom.LineString:
		return g.SetSRID(srid)
	case *geom.Polygon:
		return g.SetSRID(srid)
	case *geom.MultiPoint:
		return g.SetSRID(srid)
	case *geom.MultiLineString:
		return g.SetSRID(srid)
	case *geom.MultiPolygon:
		return g.SetSRID(srid)
	case *geom.GeometryCollection:
		return g.SetSRID(srid)
	}
	tb.Fatalf("withSRID: unsupported %T", g)
	return nil
}

// wkbBuilder assembles hand-made WKB/EWKB, little endian unless told.
type wkbBuilder struct {
	b     []byte
	order interface {
		binary.ByteOrder
		binary.AppendByteOrder
	}
}

func newWKB() *wkbBuilder { return &wkbBuilder{order: binary.LittleEndian} }

func newWKBBigEndian() *wkbBuilder { return &wkbBuilder{order: binary.BigEndian} }

// header appends a byte-order mark and a type word.
func (w *wkbBuilder) header(t uint32) *wkbBuilder {
	if w.order == binary.BigEndian {
		w.b = append(w.b, 0)
	} else {
		w.b = append(w.b, 1)
	}
	return w.u32(t)
}

func (w *wkbBuilder) u32(v uint32) *wkbBuilder {
	w.b = w.order.AppendUint32(w.b, v)
	return w
}

func (w *wkbBuilder) f64(vs ...float64) *wkbBuilder {
	for _, v := range vs {
		w.b = w.order.AppendUint64(w.b, math.Float64bits(v))
	}
	return w
}

func (w *wkbBuilder) raw(bs ...byte) *wkbBuilder {
	w.b = append(w.b, bs...)
	return w
}

func (w *wkbBuilder) bytes() []byte { return w.b }
