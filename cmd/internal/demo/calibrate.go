package demo

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/refwork"
	"github.com/spillway-go/spillway/sizing"
)

// routerFetchBytes is the router's default kafka.fetch_default_bytes: what
// each assigned partition may have prefetched ahead of the handlers.
const routerFetchBytes = 256 << 10

// Calibration is what this machine can do with the reference handler,
// measured right before the run, and the budget sized from it.
type Calibration struct {
	Cores         int `json:"cores"`
	HeavyVertices int `json:"heavy_vertices"`
	// PassSeconds is one pass of the reference work (area, centroid and
	// convex hull) over one heavy multipolygon, on one core.
	PassSeconds float64 `json:"pass_seconds"`
	// Passes is how many passes every message's handler makes: chosen so
	// that one heavy message takes HeavySeconds alone.
	Passes       int     `json:"passes"`
	HeavySeconds float64 `json:"heavy_seconds"`
	// VerticesPerSecond is the whole consumer's throughput on heavy
	// geometry, all cores busy (sizing.MeasureThroughput).
	VerticesPerSecond float64 `json:"vertices_per_second"`
	// Spread is how much more the slowest heavy messages cost per vertex
	// than the average (sizing.MeasureThroughput's spread); the deadline
	// bound gives them room (sizing.Inputs.Spread).
	Spread float64 `json:"spread"`
	// DrainShare is the share of the deadline a full budget may take to
	// drain: the headroom, or less when the spread is wide.
	DrainShare float64 `json:"drain_share"`
	// BytesPerVertex is the memory one in-flight vertex of the stream takes
	// (sizing.MeasureBytesPerVertex on a sample of the stream).
	BytesPerVertex float64 `json:"bytes_per_vertex"`
	MemoryBytes    int64   `json:"memory_bytes"`
	PrefetchBytes  int64   `json:"prefetch_bytes"`
	MemoryBound    int64   `json:"memory_bound"`
	DeadlineBound  int64   `json:"deadline_bound"`
	// Budget is the smaller bound: Spillway's starting budget.
	Budget  int64  `json:"budget"`
	Binding string `json:"binding"`
	// SteadyLoad is about what share of the machine the steady part of the
	// stream (pings and parcels) needs.
	SteadyLoad float64 `json:"steady_load"`
	Seconds    float64 `json:"seconds"` // how long calibrating took
}

// calibrate measures the reference handler on this machine and sizes the
// budget: sizing.Recommend with the deadline and memory of o. heavies are
// heavy payloads of the stream (their cost per vertex varies by a factor of
// two or three with the polygons they are made of, so the calibration uses
// several), mix a sample of the whole stream for the memory per vertex, and
// steady the vertex rate of the stream outside bursts.
func calibrate(ctx context.Context, g *Geometry, heavies, mix [][]byte, steady float64, o Options) (Calibration, error) {
	began := time.Now()
	c := Calibration{Cores: runtime.GOMAXPROCS(0), HeavyVertices: o.HeavyVertices, MemoryBytes: o.MemoryBytes}
	for len(heavies) < 2*c.Cores {
		p, _, err := g.HeavyPayload(len(heavies)*977, o.HeavyVertices)
		if err != nil {
			return c, err
		}
		heavies = append(heavies, p)
	}
	heavies = heavies[:min(len(heavies), 16)]

	// One pass per heavy payload, the best of two runs each, scaled to
	// HeavyVertices; the mean over the payloads.
	var perVertex float64
	for _, p := range heavies {
		d, err := cost.Decode(p)
		if err != nil {
			return c, err
		}
		best := time.Duration(math.MaxInt64)
		for range 2 {
			t := time.Now()
			refwork.Full(d)
			best = min(best, time.Since(t))
		}
		perVertex += best.Seconds() / float64(cost.Vertices(d)) / float64(len(heavies))
	}
	c.PassSeconds = perVertex * float64(o.HeavyVertices)
	c.Passes = o.Passes
	if c.Passes <= 0 {
		target := o.HeavyShare * o.Deadline.Seconds()
		c.Passes = max(1, int(math.Round(target/c.PassSeconds)))
	}
	c.HeavySeconds = c.PassSeconds * float64(c.Passes)

	// Throughput of the whole consumer on heavy geometry: every heavy
	// payload (at least two per core), as many at once as cores, the real
	// handler (decode included). Heavy payloads differ in cost per vertex
	// by a factor of several, so a handful would measure whichever few were
	// picked; the spread needs the slow ones too.
	sample, err := sizing.NewSample(heavies)
	if err != nil {
		return c, err
	}
	vps, spread, err := sizing.MeasureThroughput(ctx, sample, func(_ context.Context, p []byte) error {
		_, err := refwork.Process(refwork.Full, p, c.Passes)
		return err
	}, sizing.WithParallelism(c.Cores), sizing.WithRepeats(o.CalibrationRepeats))
	if err != nil {
		return c, fmt.Errorf("demo: calibrating throughput: %w", err)
	}
	c.VerticesPerSecond, c.Spread = vps, spread

	// Memory per in-flight vertex, on the stream's own mix of encodings.
	if ms, err := sizing.NewSample(append(slices.Clip(mix), heavies...)); err == nil {
		if mem, err := sizing.MeasureBytesPerVertex(ms); err == nil {
			c.BytesPerVertex = mem.BytesPerVertex
		}
	}
	if c.BytesPerVertex <= 0 {
		c.BytesPerVertex = 64 // WKB and short GeoJSON; only if measuring failed
	}
	// Each consumer prefetches up to fetch_default_bytes per partition of
	// both topics.
	c.PrefetchBytes = int64(2*o.Partitions) * routerFetchBytes
	rec, err := sizing.Recommend(sizing.Inputs{
		MemoryBytes:       o.MemoryBytes,
		Processes:         1,
		PrefetchBytes:     c.PrefetchBytes,
		BytesPerVertex:    c.BytesPerVertex,
		VerticesPerSecond: c.VerticesPerSecond,
		Deadline:          o.Deadline,
		Spread:            c.Spread,
	})
	if err != nil {
		return c, fmt.Errorf("demo: sizing the budget: %w", err)
	}
	c.MemoryBound, c.DeadlineBound, c.Budget, c.Binding = rec.MemoryBound, rec.DeadlineBound, rec.Budget, rec.Binding
	// The share of the deadline the deadline bound lets a full budget
	// take, as Recommend computes it with its defaults: the headroom
	// (0.5), or the tail share (0.75) over the spread if that is less.
	c.DrainShare = 0.5
	if c.Spread > 0 {
		c.DrainShare = min(0.5, 0.75/max(c.Spread, 1))
	}
	c.SteadyLoad = steady / c.VerticesPerSecond
	c.Seconds = time.Since(began).Seconds()
	return c, nil
}

// calibrateStream calibrates on the stream's own heavy messages and mix.
func calibrateStream(ctx context.Context, g *Geometry, st *Stream, o Options) (Calibration, error) {
	var heavies, mix [][]byte
	for _, m := range st.Messages {
		switch {
		case m.Kind == KindHeavy:
			heavies = append(heavies, m.Payload)
		case len(mix) < 2000:
			mix = append(mix, m.Payload)
		}
	}
	return calibrate(ctx, g, heavies, mix, st.SteadyVerticesPerSecond(), o)
}
