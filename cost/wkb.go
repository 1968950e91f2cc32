package cost

import (
	"encoding/binary"
	"fmt"

	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/encoding/wkbcommon"
)

// PostGIS EWKB flag bits in the geometry type word.
const (
	ewkbZ     = 0x80000000
	ewkbM     = 0x40000000
	ewkbSRID  = 0x20000000
	ewkbFlags = ewkbZ | ewkbM | ewkbSRID
)

// wkbHeaderSize is a byte-order mark plus a type word: the smallest possible
// geometry prefix. A member of a multi-geometry or collection that is not a
// point also carries a 4-byte count, so it takes at least minMemberSize bytes.
const (
	wkbHeaderSize = 1 + 4
	minMemberSize = wkbHeaderSize + 4
)

// scanBinary walks a WKB or EWKB geometry in place, without allocating, and
// returns its vertex count and whether it was read as EWKB.
//
// It accepts exactly the inputs go-geom's wkb (with NaN empty points) or ewkb
// decoder accepts, except that it also rejects trailing bytes and nesting
// deeper than maxNestingDepth; and it checks every declared count against the
// bytes that remain before go-geom would allocate for it. Decode relies on
// the first property to never hand go-geom a payload it would choke on, and
// CountPayload on both to agree with Decode.
func scanBinary(b []byte) (n int, isEWKB bool, err error) {
	if len(b) < wkbHeaderSize {
		return 0, false, fmt.Errorf("%w: wkb: %d bytes is shorter than a geometry header", ErrMalformed, len(b))
	}
	var order binary.ByteOrder = binary.LittleEndian
	if b[0] == wkbcommon.XDRID {
		order = binary.BigEndian
	}
	w := wkbWalker{buf: b, ewkb: order.Uint32(b[1:])&ewkbFlags != 0}
	_, _, n, err = w.geometry(1)
	if err != nil {
		return 0, w.ewkb, err
	}
	if w.off != len(b) {
		return 0, w.ewkb, w.errorf(ErrMalformed, "%d trailing bytes after the geometry", len(b)-w.off)
	}
	return n, w.ewkb, nil
}

// wkbWalker is a cursor over a WKB or EWKB buffer.
type wkbWalker struct {
	buf  []byte
	off  int
	ewkb bool
}

// Geometry kinds, as in the low bits of a type word.
const (
	kindPoint              = wkbcommon.PointID
	kindLineString         = wkbcommon.LineStringID
	kindPolygon            = wkbcommon.PolygonID
	kindMultiPoint         = wkbcommon.MultiPointID
	kindMultiLineString    = wkbcommon.MultiLineStringID
	kindMultiPolygon       = wkbcommon.MultiPolygonID
	kindGeometryCollection = wkbcommon.GeometryCollectionID
)

var kindNames = [...]string{
	kindPoint:              "Point",
	kindLineString:         "LineString",
	kindPolygon:            "Polygon",
	kindMultiPoint:         "MultiPoint",
	kindMultiLineString:    "MultiLineString",
	kindMultiPolygon:       "MultiPolygon",
	kindGeometryCollection: "GeometryCollection",
}

func kindName(k uint32) string {
	if k < uint32(len(kindNames)) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("type %d", k)
}

func (w *wkbWalker) errorf(sentinel error, format string, args ...any) error {
	dialect := "wkb"
	if w.ewkb {
		dialect = "ewkb"
	}
	return fmt.Errorf("%w: %s: %s", sentinel, dialect, fmt.Sprintf(format, args...))
}

// need fails unless n more bytes remain.
func (w *wkbWalker) need(n int, what string) error {
	if rem := len(w.buf) - w.off; rem < n {
		return w.errorf(ErrMalformed, "truncated at offset %d: %s needs %d bytes, %d remain", w.off, what, n, rem)
	}
	return nil
}

// count reads a uint32 element count and checks it against go-geom's
// configured limit (negative: none) and against the remaining bytes, given
// that every element takes at least minSize bytes.
func (w *wkbWalker) count(order binary.ByteOrder, limit, minSize int, what string) (int, error) {
	if rem := len(w.buf) - w.off; rem < 4 {
		return 0, w.errorf(ErrMalformed, "truncated at offset %d: the count of %s needs 4 bytes, %d remain", w.off, what, rem)
	}
	at := w.off
	v := uint64(order.Uint32(w.buf[w.off:]))
	w.off += 4
	if limit >= 0 && v > uint64(limit) {
		return 0, w.errorf(ErrTooLarge, "offset %d declares %d %s, go-geom's limit is %d", at, v, what, limit)
	}
	if rem := uint64(len(w.buf) - w.off); v*uint64(minSize) > rem {
		return 0, w.errorf(ErrMalformed, "offset %d declares %d %s, needing at least %d bytes, but only %d remain",
			at, v, what, v*uint64(minSize), rem)
	}
	return int(v), nil
}

// geometry walks one geometry at the cursor, nested depth levels deep, and
// returns its kind, layout and vertex count.
func (w *wkbWalker) geometry(depth int) (kind uint32, layout geom.Layout, n int, err error) {
	if depth > maxNestingDepth {
		return 0, 0, 0, w.errorf(ErrTooLarge, "geometry at offset %d is nested deeper than %d levels", w.off, maxNestingDepth)
	}
	if err := w.need(wkbHeaderSize, "geometry header"); err != nil {
		return 0, 0, 0, err
	}
	at := w.off
	var order binary.ByteOrder
	switch w.buf[at] {
	case wkbcommon.XDRID:
		order = binary.BigEndian
	case wkbcommon.NDRID:
		order = binary.LittleEndian
	default:
		return 0, 0, 0, w.errorf(ErrMalformed, "invalid byte order %#02x at offset %d", w.buf[at], at)
	}
	t := order.Uint32(w.buf[at+1:])
	w.off += wkbHeaderSize

	if w.ewkb {
		switch t & (ewkbZ | ewkbM) {
		case 0:
			layout = geom.XY
		case ewkbZ:
			layout = geom.XYZ
		case ewkbM:
			layout = geom.XYM
		default:
			layout = geom.XYZM
		}
		if t&ewkbSRID != 0 {
			if err := w.need(4, "SRID"); err != nil {
				return 0, 0, 0, err
			}
			w.off += 4
		}
		kind = t &^ ewkbFlags
	} else {
		switch t / 1000 {
		case 0:
			layout = geom.XY
		case 1:
			layout = geom.XYZ
		case 2:
			layout = geom.XYM
		case 3:
			layout = geom.XYZM
		default:
			return 0, 0, 0, w.errorf(ErrMalformed, "unknown geometry type %d at offset %d", t, at)
		}
		kind = t % 1000
	}
	coordSize := 8 * layout.Stride()
	limits := wkbcommon.MaxGeometryElements

	switch kind {
	case kindPoint:
		if err := w.need(coordSize, "point"); err != nil {
			return 0, 0, 0, err
		}
		// go-geom reads a point whose ordinates are all the canonical NaN as
		// an empty point.
		for i := 0; i < coordSize; i += 8 {
			if order.Uint64(w.buf[w.off+i:]) != geom.PointEmptyCoordHex {
				n = 1
				break
			}
		}
		w.off += coordSize
	case kindLineString:
		if n, err = w.count(order, limits[1], coordSize, "points"); err != nil {
			return 0, 0, 0, err
		}
		w.off += n * coordSize
	case kindPolygon:
		rings, err := w.count(order, limits[2], 4, "rings")
		if err != nil {
			return 0, 0, 0, err
		}
		for range rings {
			m, err := w.count(order, limits[1], coordSize, "points")
			if err != nil {
				return 0, 0, 0, err
			}
			w.off += m * coordSize
			n += m
		}
	case kindMultiPoint, kindMultiLineString, kindMultiPolygon, kindGeometryCollection:
		var (
			limit   = -1
			minSize = minMemberSize
			want    uint32 // required member kind; 0 for any
		)
		switch kind {
		case kindMultiPoint:
			limit, minSize, want = limits[1], wkbHeaderSize+coordSize, kindPoint
		case kindMultiLineString:
			limit, want = limits[2], kindLineString
		case kindMultiPolygon:
			limit, want = limits[3], kindPolygon
		default:
			if w.ewkb { // go-geom's ewkb decoder limits collections, wkb does not
				limit = limits[1]
			}
		}
		members, err := w.count(order, limit, minSize, "geometries")
		if err != nil {
			return 0, 0, 0, err
		}
		for i := range members {
			start := w.off
			k, l, m, err := w.geometry(depth + 1)
			if err != nil {
				return 0, 0, 0, err
			}
			if want != 0 && k != want {
				return 0, 0, 0, w.errorf(ErrMalformed, "member %d at offset %d of a %s is a %s",
					i, start, kindName(kind), kindName(k))
			}
			if want != 0 && l != layout {
				return 0, 0, 0, w.errorf(ErrMalformed, "member %d at offset %d has layout %v, its %s has %v",
					i, start, l, kindName(kind), layout)
			}
			n += m
		}
	default:
		return 0, 0, 0, w.errorf(ErrMalformed, "unsupported geometry type %d at offset %d", t, at)
	}
	return kind, layout, n, nil
}
