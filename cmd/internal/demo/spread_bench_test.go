package demo

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/twpayne/go-geom"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/refwork"
)

// BenchmarkHeavyCostPerVertex shows how much the cost per vertex of the
// reference handler varies between heavy messages of the same size: 60
// heavy multipolygons of 20,000 vertices, built from the test data as the
// goodput sweep builds them, each processed once per iteration on one core.
// It reports the fastest, median, mean, 95th percentile and slowest
// payload's nanoseconds per vertex (each payload's best over the
// iterations), and the spread as sizing.MeasureThroughput defines it:
//
//	go test -run '^$' -bench HeavyCostPerVertex -benchtime 3x ./internal/demo/
func BenchmarkHeavyCostPerVertex(b *testing.B) {
	g, err := LoadGeometry()
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 7))
	var (
		geoms    []geom.T
		vertices []int
	)
	for range 60 {
		p, v, err := g.HeavyPayload(rng.IntN(len(g.Polygons)), 20_000)
		if err != nil {
			b.Fatal(err)
		}
		d, err := cost.Decode(p)
		if err != nil {
			b.Fatal(err)
		}
		geoms, vertices = append(geoms, d), append(vertices, v)
	}
	best := make([]time.Duration, len(geoms))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for i, d := range geoms {
			t := time.Now()
			refwork.Full(d)
			if took := time.Since(t); best[i] == 0 || took < best[i] {
				best[i] = took
			}
		}
	}
	b.StopTimer()
	per := make([]float64, len(best))
	var secs, verts float64
	for i, d := range best {
		per[i] = float64(d.Nanoseconds()) / float64(vertices[i])
		secs += float64(d.Nanoseconds())
		verts += float64(vertices[i])
	}
	sorted := slices.Clone(per)
	slices.Sort(sorted)
	mean := secs / verts
	b.ReportMetric(sorted[0], "min-ns/vertex")
	b.ReportMetric(sorted[len(sorted)/2], "median-ns/vertex")
	b.ReportMetric(mean, "mean-ns/vertex")
	b.ReportMetric(sorted[len(sorted)*95/100], "p95-ns/vertex")
	b.ReportMetric(sorted[len(sorted)-1], "max-ns/vertex")
	b.ReportMetric(sorted[len(sorted)*95/100]/mean, "spread")
}
