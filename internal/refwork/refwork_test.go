package refwork

import (
	"testing"

	"github.com/twpayne/go-geom"
)

func TestCrossings(t *testing.T) {
	square := geom.NewPolygonFlat(geom.XY, []float64{0, 0, 4, 0, 4, 4, 0, 4, 0, 0}, []int{10})
	bowtie := geom.NewPolygonFlat(geom.XY, []float64{0, 0, 4, 4, 4, 0, 0, 4, 0, 0}, []int{10})
	strip := geom.NewPolygonFlat(geom.XY, []float64{1, -1, 3, -1, 3, 5, 1, 5, 1, -1}, []int{10})
	lines := geom.NewMultiLineStringFlat(geom.XY, []float64{10, 0, 12, 2, 10, 2, 12, 0}, []int{4, 8})
	for name, tt := range map[string]struct {
		g    geom.T
		want float64
	}{
		"square":         {square, 0},
		"bowtie":         {bowtie, 1},
		"crossing lines": {lines, 1},
		"collection":     {geom.NewGeometryCollection().MustPush(bowtie, lines), 2},
		// Members are compared with each other too: the strip's two long
		// sides cross both diagonals of the bowtie.
		"overlapping members": {geom.NewGeometryCollection().MustPush(strip, bowtie), 4 + 1},
		"point has no lines":  {geom.NewPointFlat(geom.XY, []float64{1, 2}), 0},
	} {
		if got := Crossings(tt.g); got != tt.want {
			t.Errorf("%s: %v crossings, want %v", name, got, tt.want)
		}
	}
}

// go-geom's convex hull panics when every point is on one line; Hull
// reports no area instead.
func TestHullOfCollinearPoints(t *testing.T) {
	flat := geom.NewPolygonFlat(geom.XY, []float64{0, 0, 1, 1, 2, 2, 3, 3, 0, 0}, []int{10})
	if got := Hull(flat); got != 0 {
		t.Errorf("hull area %v, want 0", got)
	}
	for _, name := range Names() {
		if _, err := ByName(name); err != nil || Descriptions[name] == "" {
			t.Errorf("%s: %v, description %q", name, err, Descriptions[name])
		}
	}
}

func TestProcessUntil(t *testing.T) {
	payload := []byte(`{"type":"Polygon","coordinates":[[[0,0],[4,0],[4,4],[0,4],[0,0]]]}`)
	want, err := Process(Full, payload, 3)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := ProcessUntil(Full, payload, 3, nil)
	if err != nil || !ok || got != want {
		t.Errorf("no stop: %v %v %v, want %v", got, ok, err, want)
	}
	calls := 0
	_, ok, err = ProcessUntil(Full, payload, 3, func() bool { calls++; return calls > 2 })
	if err != nil || ok || calls != 3 {
		t.Errorf("stopped after two passes: ok %v, err %v, %d stop calls", ok, err, calls)
	}
	if _, _, err := ProcessUntil(Full, []byte("nope"), 1, nil); err == nil {
		t.Error("undecodable payload: no error")
	}
}
