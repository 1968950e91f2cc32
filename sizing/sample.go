package sizing

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/spillway-go/spillway/cost"
)

// ErrEmptySample is returned by [ReadSample] and [NewSample] for an input
// without any payload, and by the measuring functions for a nil sample or
// one without any vertex: there is nothing to divide by.
var ErrEmptySample = errors.New("sizing: sample has no geometries")

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

// SampleLineError reports the line of a sample that is not a spatial payload
// with at least one vertex. It wraps the decoding error (one of
// [cost.Decode]'s sentinels), so errors.Is works for those.
type SampleLineError struct {
	Line int // 1-based
	Err  error
}

func (e *SampleLineError) Error() string {
	return fmt.Sprintf("line %d: %v", e.Line, e.Err)
}

// Unwrap returns the cause.
func (e *SampleLineError) Unwrap() error { return e.Err }

// ReadSample reads newline-delimited payloads, one message per line: GeoJSON
// (a Feature, a Geometry or a FeatureCollection, properties included, since
// they travel with the message and take memory too) or hex-encoded WKB/EWKB.
// Blank lines are skipped. Each line must decode and hold at least one
// vertex; the first one that does not fails the read with a
// [*SampleLineError] naming its line. An input without any payload fails
// with [ErrEmptySample].
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
			return nil, &SampleLineError{Line: line, Err: err}
		}
		if n == 0 {
			return nil, &SampleLineError{Line: line, Err: errors.New("geometry has no vertices")}
		}
		s.add(bytes.Clone(b), n)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &SampleLineError{Line: line + 1,
				Err: fmt.Errorf("%w: line longer than %d bytes", cost.ErrTooLarge, maxSampleLine)}
		}
		return nil, fmt.Errorf("sizing: reading sample: %w", err)
	}
	if len(s.Payloads) == 0 {
		return nil, ErrEmptySample
	}
	return s, nil
}

// NewSample counts the vertices of payloads and returns them as a sample.
// The payloads are not copied. A payload that cannot be counted fails with
// an error naming its index and wrapping the decoding error; an empty list
// fails with [ErrEmptySample]. Payloads without vertices are kept (they
// count as zero vertices).
func NewSample(payloads [][]byte) (*Sample, error) {
	if len(payloads) == 0 {
		return nil, ErrEmptySample
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
