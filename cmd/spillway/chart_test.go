package main

import (
	"math"
	"testing"

	"github.com/spillway-go/spillway/sizing"
)

func TestMixThroughput(t *testing.T) {
	const light, heavy = 2_000_000.0, 500_000.0
	tests := []struct{ share, want float64 }{
		{0, light},
		{1, heavy},
		{-1, light},
		{2, heavy},
		// Half the vertices at 0.5 µs and half at 2 µs: 1.25 µs a vertex.
		{0.5, 800_000},
	}
	for _, tt := range tests {
		if got := mixThroughput(light, heavy, tt.share); math.Abs(got-tt.want) > 1e-6*tt.want {
			t.Errorf("mixThroughput(share %v) = %v, want %v", tt.share, got, tt.want)
		}
	}
	// Harmonic, so never above the linear interpolation.
	for s := 0.0; s <= 1; s += 0.1 {
		if got, lin := mixThroughput(light, heavy, s), light+(heavy-light)*s; got > lin*(1+1e-12) {
			t.Errorf("share %v: %v above the linear %v", s, got, lin)
		}
	}
}

func TestSplitSample(t *testing.T) {
	s, err := sizing.NewSample([][]byte{
		[]byte(`{"type":"Point","coordinates":[1,2]}`),
		[]byte(`{"type":"Polygon","coordinates":[[[0,0],[4,0],[4,4],[0,4],[0,0]]]}`),
		[]byte(`{"type":"LineString","coordinates":[[0,0],[1,1],[2,2]]}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, b := sampleTotals(s); v != 9 || b != int64(len(s.Payloads[0])+len(s.Payloads[1])+len(s.Payloads[2])) {
		t.Fatalf("totals %d vertices, %d bytes", v, b)
	}
	light, heavy := splitSample(s, 3)
	lv, _ := sampleTotals(light)
	hv, _ := sampleTotals(heavy)
	if len(light.Payloads) != 2 || len(heavy.Payloads) != 1 || hv != 5 || lv != 4 {
		t.Fatalf("split at 3: light %+v, heavy %+v", light, heavy)
	}
	if l, h := splitSample(s, 100); h != nil || len(l.Payloads) != 3 {
		t.Fatalf("split at 100: heavy %+v", h)
	}
}

func TestMemoryReportSource(t *testing.T) {
	s, err := sizing.NewSample([][]byte{[]byte(`{"type":"LineString","coordinates":[[0,0],[1,1]]}`)})
	if err != nil {
		t.Fatal(err)
	}
	if r := newMemoryReport(s, sizing.MemoryProfile{PeakHeapBytes: 200, RSSBytes: 100}); r.Source != "heap" || r.Vertices != 2 || r.Payloads != 1 {
		t.Errorf("heap larger: %+v", r)
	}
	if r := newMemoryReport(s, sizing.MemoryProfile{PeakHeapBytes: 100, RSSBytes: 200}); r.Source != "rss" {
		t.Errorf("rss larger: %+v", r)
	}
}
