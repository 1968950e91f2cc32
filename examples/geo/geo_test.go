package geo

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadFeatures(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.ndjson")
	b := filepath.Join(dir, "b.ndjson")
	square := `{"type":"Polygon","coordinates":[[[0,0],[4,0],[4,4],[0,4],[0,0]]]}`
	if err := os.WriteFile(a, []byte(`{"type":"Feature","id":"SQ","geometry":`+square+"}\n\n"+
		`{"type":"Feature","id":7,"geometry":{"type":"Point","coordinates":[1,2]}}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte(`{"type":"Feature","geometry":{"type":"LineString","coordinates":[[0,0],[1,1],[2,0]]}}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Load(a + ", " + b)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		id       string
		vertices int
	}{{"SQ", 5}, {"7", 1}, {"line-1", 3}}
	if len(got) != len(want) {
		t.Fatalf("%d features, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].ID != w.id || got[i].Vertices != w.vertices {
			t.Errorf("feature %d: id %q, %d vertices; want %q, %d", i, got[i].ID, got[i].Vertices, w.id, w.vertices)
		}
	}
	if string(got[0].Geometry) != square {
		t.Errorf("geometry %s, want %s", got[0].Geometry, square)
	}

	// A missing file says which flag to set.
	_, err = Load(filepath.Join(dir, "missing.ndjson"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "-data") {
		t.Errorf("missing file: %v, want a not-exist error naming -data", err)
	}
	if err := os.WriteFile(b, []byte(`{"type":"Feature","id":"x"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(b); err == nil || !strings.Contains(err.Error(), "no geometry") {
		t.Errorf("feature without geometry: %v", err)
	}
}

func TestWork(t *testing.T) {
	square := []byte(`{"type":"Polygon","coordinates":[[[0,0],[4,0],[4,4],[0,4],[0,0]]]}`)
	one, err := Work(square, 1)
	if err != nil || one == 0 {
		t.Errorf("square: %v %v, want a result other than 0", one, err)
	}
	if two, err := Work(square, 2); err != nil || two != 2*one {
		t.Errorf("square, 2 passes: %v %v, want %v", two, err, 2*one)
	}
	// go-geom's hull panics on collinear points; work carries on.
	if _, err := Work([]byte(`{"type":"Polygon","coordinates":[[[0,0],[1,1],[2,2],[3,3],[0,0]]]}`), 1); err != nil {
		t.Error(err)
	}
	if _, err := Work([]byte(`not geometry`), 1); err == nil {
		t.Error("no error for a payload that is not geometry")
	}
}
