package cost

import (
	"errors"
	"fmt"
	"strconv"
)

// countCoordinates counts the positions in the "coordinates" array of a
// GeoJSON geometry whose positions are nested levels deep (1 for a Point, 2
// for a LineString or MultiPoint, 3 for a Polygon or MultiLineString, 4 for a
// MultiPolygon). It returns the vertex count and the number of top-level
// elements (the members of a multi-geometry).
//
// raw must be valid JSON (encoding/json has already checked it). The rules
// are go-geom's, so that counting accepts exactly what decoding accepts:
//
//   - every number must fit a float64; null stands for 0 inside a position,
//     for a missing position (an error) in a position's place, and for an
//     empty array elsewhere;
//   - the layout comes from the first position reached by always following
//     the first element, and must have at least two ordinates; if an empty
//     array is reached first, the layout is XY;
//   - every position must have as many ordinates as the layout;
//   - a Point's array may be empty (an empty point) but not of length one;
//   - a MultiPoint may hold null positions (empty points, no vertex), except
//     in first place, where a position is needed for the layout.
//
// parts is the number of arrays of positions, or of such arrays, that the
// geometry holds (a MultiPolygon's polygons and their rings, say): what
// decoding allocates an object for, whether or not it has vertices.
func countCoordinates(raw []byte, levels int, multiPoint bool) (vertices, members, parts int, err error) {
	s := coordScanner{b: raw, nullIsEmptyPoint: multiPoint}
	if levels == 1 {
		dims, err := s.position()
		switch {
		case err != nil:
			return 0, 0, 0, err
		case dims == 0:
			return 0, 0, 0, nil
		case dims == 1:
			return 0, 0, 0, errDimensions(dims)
		}
		return 1, 0, 0, nil
	}
	vertices, members, err = s.array(levels)
	return vertices, members, s.parts, err
}

// coordScanner is a cursor over a valid JSON value.
type coordScanner struct {
	b                []byte
	i                int
	stride           int  // ordinates per position; 0 until the layout is known
	nullIsEmptyPoint bool // a null position is an empty point (MultiPoint)
	parts            int  // arrays scanned above the positions
}

func errDimensions(n int) error {
	return fmt.Errorf("position with %d ordinates, need at least 2", n)
}

func (s *coordScanner) skipSpace() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (s *coordScanner) peek() byte {
	s.skipSpace()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// unexpected describes the JSON value at the cursor.
func (s *coordScanner) unexpected(want string) error {
	got := "end of input"
	switch c := s.peek(); {
	case c == '{':
		got = "object"
	case c == '[':
		got = "array"
	case c == '"':
		got = "string"
	case c == 't' || c == 'f':
		got = "boolean"
	case c == 'n':
		got = "null"
	case c == '-' || '0' <= c && c <= '9':
		got = "number"
	}
	return fmt.Errorf("%s where %s expected at byte %d", got, want, s.i)
}

// consumeNull consumes a null literal if one is next.
func (s *coordScanner) consumeNull() bool {
	if s.peek() == 'n' {
		s.i += len("null")
		return true
	}
	return false
}

// elements iterates over the elements of the array at the cursor, calling
// each with the cursor on the element. It reports whether the value was an
// array.
func (s *coordScanner) elements(each func() error) (bool, error) {
	if s.peek() != '[' {
		return false, nil
	}
	s.i++
	if s.peek() == ']' {
		s.i++
		return true, nil
	}
	for {
		if err := each(); err != nil {
			return true, err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return true, nil
		default:
			return true, s.unexpected("',' or ']'")
		}
	}
}

// array scans an array of positions nested levels deep (levels >= 2) and
// returns the positions in it and its length.
func (s *coordScanner) array(levels int) (vertices, length int, err error) {
	if s.consumeNull() {
		s.decideEmpty()
		return 0, 0, nil
	}
	isArray, err := s.elements(func() error {
		length++
		if levels == 2 {
			if s.stride != 0 && s.nullIsEmptyPoint && s.consumeNull() {
				return nil
			}
			dims, err := s.position()
			if err != nil {
				return err
			}
			if s.stride == 0 {
				if dims < 2 {
					return errDimensions(dims)
				}
				s.stride = dims
			} else if dims != s.stride {
				return fmt.Errorf("position with %d ordinates in a layout of %d", dims, s.stride)
			}
			vertices++
			return nil
		}
		v, _, err := s.array(levels - 1)
		vertices += v
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	if !isArray {
		return 0, 0, s.unexpected("array")
	}
	s.parts++
	if length == 0 {
		s.decideEmpty()
	}
	return vertices, length, nil
}

// decideEmpty records that an empty array came before any position: the
// layout defaults to XY.
func (s *coordScanner) decideEmpty() {
	if s.stride == 0 {
		s.stride = 2
	}
}

// position scans one position, an array of numbers (or nulls, read as 0),
// and returns its length. A null position has length 0.
func (s *coordScanner) position() (int, error) {
	if s.consumeNull() {
		return 0, nil
	}
	dims := 0
	isArray, err := s.elements(func() error {
		dims++
		if s.consumeNull() {
			return nil
		}
		return s.number()
	})
	if err != nil {
		return 0, err
	}
	if !isArray {
		return 0, s.unexpected("position array")
	}
	return dims, nil
}

var errNumberRange = errors.New("number out of float64 range")

// number consumes a JSON number that must fit a float64.
func (s *coordScanner) number() error {
	start := s.i
	exponent := false
	for s.i < len(s.b) {
		c := s.b[s.i]
		if '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' {
			s.i++
			continue
		}
		if c == 'e' || c == 'E' {
			exponent = true
			s.i++
			continue
		}
		break
	}
	if s.i == start {
		return s.unexpected("number")
	}
	// Without an exponent, fewer than 309 digits cannot exceed the largest
	// float64 (about 1.8e308); only parse the rare numbers that might.
	if exponent || s.i-start >= 300 {
		if _, err := strconv.ParseFloat(string(s.b[start:s.i]), 64); err != nil {
			return fmt.Errorf("%w: %s", errNumberRange, s.b[start:s.i])
		}
	}
	return nil
}
