// Package geodata loads the real geometry the examples, demo and tests stream:
// the NDJSON GeoJSON files in the repository's testdata directory.
//
// Files are found at run time, not embedded, so the library carries no data:
// SPILLWAY_TESTDATA names the directory explicitly; otherwise the loader walks
// up from the working directory to the module root (the go.mod of
// github.com/spillway-go/spillway) and uses its testdata directory.
package geodata

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spillway-go/spillway/cost"
)

// The shipped samples.
const (
	// Countries: 220 countries, 71,129 vertices in all (MIT licence).
	Countries = "countries-land-10km.ndjson"
	// Counties: 3,231 US counties, 68,313 vertices in all (ISC licence).
	Counties = "us-counties-10m.ndjson"
)

// EnvDir is the environment variable that overrides where samples are read.
const EnvDir = "SPILLWAY_TESTDATA"

const modulePath = "github.com/spillway-go/spillway"

// Feature is one line of a sample: its id, its geometry as GeoJSON, and the
// geometry's vertex count.
type Feature struct {
	ID       string
	Geometry json.RawMessage
	Vertices int
}

// Dir returns the directory the samples are read from.
func Dir() (string, error) {
	if d := os.Getenv(EnvDir); d != "" {
		return d, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			bytes.Contains(b, []byte("module "+modulePath+"\n")) {
			return filepath.Join(dir, "testdata"), nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("geodata: no %s module above %s; set %s to the testdata directory", modulePath, wd, EnvDir)
		}
	}
}

// Load reads the named sample (a file name such as [Countries], or a path).
func Load(name string) ([]Feature, error) {
	path := name
	if filepath.Base(name) == name {
		dir, err := Dir()
		if err != nil {
			return nil, err
		}
		path = filepath.Join(dir, name)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("geodata: %w", err)
	}
	defer f.Close()
	return Read(f, path)
}

// Read parses NDJSON GeoJSON features from r; name is used in errors.
func Read(r interface{ Read([]byte) (int, error) }, name string) ([]Feature, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var out []Feature
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var f struct {
			ID       json.RawMessage `json:"id"`
			Geometry json.RawMessage `json:"geometry"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("geodata: %s:%d: %w", name, line, err)
		}
		if len(f.Geometry) == 0 || string(f.Geometry) == "null" {
			return nil, fmt.Errorf("geodata: %s:%d: feature has no geometry", name, line)
		}
		n, err := cost.CountPayload(f.Geometry)
		if err != nil {
			return nil, fmt.Errorf("geodata: %s:%d: %w", name, line, err)
		}
		var id string
		if err := json.Unmarshal(f.ID, &id); err != nil {
			id = string(f.ID)
		}
		out = append(out, Feature{ID: id, Geometry: append(json.RawMessage(nil), f.Geometry...), Vertices: n})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("geodata: %s: %w", name, err)
	}
	if len(out) == 0 {
		return nil, errors.New("geodata: " + name + ": no features")
	}
	return out, nil
}
