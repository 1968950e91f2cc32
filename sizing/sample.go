package sizing

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/spillway-go/spillway/cost"
)

// errEmptySample is returned by [ReadSample] and [NewSample] for an input
// without any payload, and by the measuring functions for a nil sample or
// one without any vertex: there is nothing to divide by.
var errEmptySample = errors.New("sizing: empty sample: no geometries")

// maxSampleLine bounds one line of a sample, like [cost.MaxPayloadBytes] bounds a
// payload.
const maxSampleLine = cost.MaxPayloadBytes

// Sample is a set of real payloads to size a budget on, with the vertex
// count of each. Build one with [ReadSample] or [NewSample]; it is read-only
// afterwards and safe to share between goroutines.
type Sample struct {
	// Payloads are the messages' bodies, as they travel on the wire.
	Payloads [][]byte
	// Vertices[i] is the vertex count of Payloads[i] ([cost.CountPayload]).
	Vertices []int
}

// ReadSample reads newline-delimited payloads, one message per line: GeoJSON
// (a Feature, a Geometry or a FeatureCollection, properties included, since
// they travel with the message and take memory too) or hex-encoded WKB/EWKB.
// Blank lines are skipped. Each line must decode and hold at least one
// vertex; the first one that does not fails the read with an error naming
// its line and wrapping the decoding error (one of [cost.Decode]'s
// sentinels, so errors.Is works for those). An input without any payload
// fails too.
//
// Take the sample from the busiest hour of real traffic, as one contiguous
// window: the mix of light and heavy geometry is what sets the budget.
func ReadSample(r io.Reader) (*Sample, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxSampleLine)
	s := &Sample{}
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		n, err := cost.CountPayload(b)
		if err != nil {
			return nil, lineError(line, err)
		}
		if n == 0 {
			return nil, lineError(line, errors.New("geometry has no vertices"))
		}
		s.add(bytes.Clone(b), n)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, lineError(line+1, fmt.Errorf("%w: line longer than %d bytes", cost.ErrTooLarge, maxSampleLine))
		}
		return nil, fmt.Errorf("sizing: reading sample: %w", err)
	}
	if len(s.Payloads) == 0 {
		return nil, errEmptySample
	}
	return s, nil
}

// lineError says that line of a sample is not a geometry, wrapping why.
func lineError(line int, err error) error {
	return fmt.Errorf("sizing: sample line %d is not a geometry: %w", line, err)
}

// NewSample counts the vertices of payloads and returns them as a sample.
// The payloads are not copied. A payload that cannot be counted fails with
// an error naming its index and wrapping the decoding error; so does an
// empty list. Payloads without vertices are kept (they
// count as zero vertices).
func NewSample(payloads [][]byte) (*Sample, error) {
	if len(payloads) == 0 {
		return nil, errEmptySample
	}
	s := &Sample{Payloads: make([][]byte, 0, len(payloads)), Vertices: make([]int, 0, len(payloads))}
	for i, p := range payloads {
		n, err := cost.CountPayload(p)
		if err != nil {
			return nil, fmt.Errorf("sizing: sample payload %d: %w", i, err)
		}
		s.add(p, n)
	}
	return s, nil
}

func (s *Sample) add(p []byte, n int) {
	s.Payloads = append(s.Payloads, p)
	s.Vertices = append(s.Vertices, n)
}

// totalVertices is the sum of s.Vertices; 0 for a nil sample.
func (s *Sample) totalVertices() int64 {
	if s == nil {
		return 0
	}
	var n int64
	for _, v := range s.Vertices {
		n += int64(v)
	}
	return n
}
