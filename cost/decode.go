package cost

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/encoding/ewkb"
	"github.com/twpayne/go-geom/encoding/wkb"
	"github.com/twpayne/go-geom/encoding/wkbcommon"
)

// MaxPayloadBytes is the largest payload [Decode] and [CountPayload] accept.
// Larger payloads fail with [ErrTooLarge] before any parsing.
const MaxPayloadBytes = 256 << 20

// maxNestingDepth bounds how deeply geometries may be nested, counting the
// outermost geometry as depth 1. A polygon or point has depth 1, a
// multi-geometry 2 (its members count as nested), a collection holding a
// multipolygon 3, and so on. FeatureCollections decode to a collection, so
// their features' geometries start at depth 2. Deeper payloads fail with
// [ErrTooLarge]; real data never comes close.
const maxNestingDepth = 32

// Errors returned by [Decode] and [CountPayload]. They are always wrapped with
// context (format, offset, what was expected); test with [errors.Is].
var (
	// ErrMalformed: the payload is not a geometry that can be decoded:
	// empty or only whitespace, of a format other than GeoJSON, WKB, EWKB
	// or hex-encoded WKB/EWKB, or of a recognised format but truncated,
	// with inconsistent counts, unsupported geometry types, mixed layouts,
	// invalid JSON and so on. The wrapped text says which.
	ErrMalformed = errors.New("cost: malformed geometry")
	// ErrTooLarge: the payload exceeds [MaxPayloadBytes], nests geometries
	// deeper than 32 levels (the outermost geometry is level 1, the members
	// of a multi-geometry level 2), or exceeds go-geom's configured element
	// limits (wkbcommon.MaxGeometryElements).
	ErrTooLarge = errors.New("cost: geometry too large")
)

// The kinds of [ErrMalformed] that are not about a recognised format.
var (
	errEmptyPayload  = fmt.Errorf("%w: empty payload", ErrMalformed)
	errUnknownFormat = fmt.Errorf("%w: unknown payload format", ErrMalformed)
)

// IsUndecodable reports whether err, or any error it wraps, says that a
// payload cannot be decoded: [ErrMalformed] or [ErrTooLarge]. Decoding the same payload again fails
// the same way, so a consumer should set such a message aside (the router
// dead-letters it with cause "malformed") rather than retry it.
func IsUndecodable(err error) bool {
	return errors.Is(err, ErrMalformed) || errors.Is(err, ErrTooLarge)
}

// format is the encoding of a payload, as detected by sniff.
type format uint8

const (
	formatGeoJSON format = iota + 1
	formatBinary         // WKB or EWKB, told apart by the type word
)

// Decode parses a spatial payload into a go-geom geometry. The format is
// detected from the bytes:
//
//   - GeoJSON (first byte after optional whitespace and UTF-8 BOM is '{'): a
//     Geometry object decodes to that geometry; a Feature to its geometry; a
//     FeatureCollection to a [geom.GeometryCollection] holding its features'
//     geometries in order. A Feature whose "geometry" is null (an unlocated
//     feature, allowed by RFC 7946) decodes to an empty
//     [geom.GeometryCollection], which has no vertices; a Feature with no
//     "geometry" member at all is malformed.
//   - WKB or EWKB (first byte 0x00 or 0x01, the byte-order mark): EWKB is
//     chosen when the outermost type word carries any of the PostGIS Z, M or
//     SRID flag bits, otherwise OGC/ISO WKB (including the ISO 1000/2000/3000
//     Z/M type codes). A point whose coordinates are all NaN is an empty
//     point in both. Bytes after the geometry are rejected.
//   - Hex-encoded WKB or EWKB (text consisting only of an even number of hex
//     digits, optionally surrounded by whitespace), as printed by PostGIS.
//
// Before binary input reaches go-geom, its structure is walked without
// allocating: every declared count must fit in the bytes that remain and
// nesting is capped at 32 levels, so a tiny payload declaring
// billions of points fails fast with [ErrMalformed] instead of allocating
// gigabytes.
//
// Errors wrap [ErrMalformed] or [ErrTooLarge]. Decode never panics on bad input: a panic inside go-geom is
// reported as ErrMalformed.
func Decode(payload []byte) (geom.T, error) {
	f, body, err := sniff(payload)
	if err != nil {
		return nil, err
	}
	if f == formatGeoJSON {
		return decodeGeoJSON(body)
	}
	return decodeBinary(body)
}

// CountPayload returns the number of vertices in a spatial payload: the same
// value as [Vertices] of the geometry [Decode] returns, and an error exactly
// when Decode fails, wrapping the same sentinel. It never builds the
// geometry: WKB and EWKB (also hex-encoded) are counted by walking the binary
// structure in place, and GeoJSON by scanning the coordinate arrays with the
// rules go-geom decodes them by.
func CountPayload(payload []byte) (int, error) {
	f, body, err := sniff(payload)
	if err != nil {
		return 0, err
	}
	if f == formatGeoJSON {
		return countGeoJSON(body)
	}
	n, _, err := scanBinary(body)
	return n, err
}

// sniff detects the format of payload and returns the bytes to decode: the
// payload itself for binary input, the payload without leading whitespace for
// GeoJSON, and the decoded bytes for hex text.
func sniff(payload []byte) (format, []byte, error) {
	if len(payload) == 0 {
		return 0, nil, errEmptyPayload
	}
	if len(payload) > MaxPayloadBytes {
		return 0, nil, fmt.Errorf("%w: payload is %d bytes, limit is %d", ErrTooLarge, len(payload), MaxPayloadBytes)
	}
	if payload[0] == wkbcommon.XDRID || payload[0] == wkbcommon.NDRID {
		return formatBinary, payload, nil
	}
	text := trimSpace(payload)
	if len(text) == 0 {
		return 0, nil, fmt.Errorf("%w: %d bytes of whitespace", errEmptyPayload, len(payload))
	}
	switch c := text[0]; {
	case c == '{':
		return formatGeoJSON, text, nil
	case isHexDigit(c):
		return sniffHex(text)
	}
	return 0, nil, fmt.Errorf("%w: unexpected first byte %q", errUnknownFormat, text[0])
}

// sniffHex decodes text that starts with a hex digit, if it is entirely hex
// digits and encodes something that starts with a WKB byte-order mark.
func sniffHex(text []byte) (format, []byte, error) {
	for _, c := range text {
		if !isHexDigit(c) {
			return 0, nil, fmt.Errorf("%w: text is neither GeoJSON nor hex-encoded WKB", errUnknownFormat)
		}
	}
	if len(text)%2 != 0 {
		return 0, nil, fmt.Errorf("%w: hex WKB: odd number of hex digits (%d)", ErrMalformed, len(text))
	}
	if first := fromHex(text[0])<<4 | fromHex(text[1]); first != wkbcommon.XDRID && first != wkbcommon.NDRID {
		return 0, nil, fmt.Errorf("%w: hex text does not start with a WKB byte-order mark", errUnknownFormat)
	}
	body := make([]byte, len(text)/2)
	if _, err := hex.Decode(body, text); err != nil {
		return 0, nil, fmt.Errorf("%w: hex WKB: %v", ErrMalformed, err)
	}
	return formatBinary, body, nil
}

// trimSpace drops a leading UTF-8 byte-order mark and JSON whitespace at both
// ends.
func trimSpace(b []byte) []byte {
	if len(b) >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF {
		b = b[3:]
	}
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// hexDigits marks the bytes that are hex digits.
var hexDigits = func() (t [256]bool) {
	for _, c := range []byte("0123456789abcdefABCDEF") {
		t[c] = true
	}
	return t
}()

func isHexDigit(c byte) bool { return hexDigits[c] }

func fromHex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	default:
		return c - 'a' + 10
	}
}

// decodeBinary validates WKB or EWKB with scanBinary and then decodes it with
// go-geom.
func decodeBinary(b []byte) (geom.T, error) {
	_, isEWKB, err := scanBinary(b)
	if err != nil {
		return nil, err
	}
	if isEWKB {
		return guard("ewkb", func() (geom.T, error) { return ewkb.Unmarshal(b) })
	}
	return guard("wkb", func() (geom.T, error) {
		return wkb.Unmarshal(b, wkbcommon.WKBOptionEmptyPointHandling(wkbcommon.EmptyPointHandlingNaN))
	})
}

// guard runs a go-geom decoder, classifying its errors and turning a panic
// into ErrMalformed so hostile input cannot crash the caller.
func guard(what string, decode func() (geom.T, error)) (g geom.T, err error) {
	defer func() {
		if r := recover(); r != nil {
			g, err = nil, fmt.Errorf("%w: %s: decoder panicked: %v", ErrMalformed, what, r)
		}
	}()
	g, err = decode()
	if err != nil {
		var tooLarge wkbcommon.ErrGeometryTooLarge
		if errors.As(err, &tooLarge) {
			return nil, fmt.Errorf("%w: %s: %w", ErrTooLarge, what, err)
		}
		return nil, fmt.Errorf("%w: %s: %w", ErrMalformed, what, err)
	}
	return g, nil
}
