// Package geo is what the examples share: loading GeoJSON features from
// NDJSON files (their -data flag) and the reference work a handler does on
// each geometry (area, centroid and convex hull, repeated). It is example
// code, outside the library: copy it with an example, or import it.
package geo

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/xy"

	"github.com/spillway-go/spillway/cost"
)

// Feature is one line of a data file: an id, a GeoJSON geometry and its
// vertex count.
type Feature struct {
	ID       string
	Geometry json.RawMessage
	Vertices int
}

// Load reads every file in paths (comma-separated), each a file of
// GeoJSON features, one per line (NDJSON).
func Load(paths string) ([]Feature, error) {
	var all []Feature
	for _, path := range strings.Split(paths, ",") {
		more, err := readFeatures(strings.TrimSpace(path))
		if err != nil {
			return nil, err
		}
		all = append(all, more...)
	}
	return all, nil
}

func readFeatures(path string) ([]Feature, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: set -data to NDJSON files of GeoJSON features (the default is relative to the repository root)", err)
	} else if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Feature
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20) // a line holds a whole geometry
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var rec struct {
			ID       json.RawMessage `json:"id"`
			Geometry json.RawMessage `json:"geometry"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if len(rec.Geometry) == 0 || string(rec.Geometry) == "null" {
			return nil, fmt.Errorf("%s:%d: feature has no geometry", path, line)
		}
		n, err := cost.CountPayload(rec.Geometry)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		var id string // a string id as is, a number as written
		if json.Unmarshal(rec.ID, &id) != nil {
			id = string(rec.ID)
		}
		if id == "" {
			id = fmt.Sprint("line-", line)
		}
		out = append(out, Feature{ID: id, Geometry: rec.Geometry, Vertices: n})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no features", path)
	}
	return out, nil
}

// Work is the reference handler's body, a stand-in for real spatial work:
// decode the payload, then compute the planar area, the centroid and the
// convex hull passes times. Its cost grows with the vertex count.
func Work(payload []byte, passes int) (float64, error) {
	g, err := cost.Decode(payload)
	if err != nil {
		return 0, err
	}
	var sum float64
	for range max(passes, 1) {
		sum += measure(g)
	}
	return sum, nil // returned so the work is not optimised away
}

func measure(g geom.T) (sum float64) {
	if a, ok := g.(interface{ Area() float64 }); ok {
		sum += a.Area()
	}
	if c, err := xy.Centroid(g); err == nil && len(c) > 0 {
		sum += c[0]
	}
	// go-geom's convex hull panics when every point is on one line: such a
	// hull has no area.
	defer func() { _ = recover() }()
	if h, ok := xy.ConvexHull(g).(*geom.Polygon); ok {
		sum += h.Area()
	}
	return sum
}
