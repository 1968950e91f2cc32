package sizing

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway/cost"
)

// measureMu serializes memory measurements: each one switches the garbage
// collector off for the whole process.
var measureMu sync.Mutex

// MemoryProfile is what holding a sample in flight costs in memory.
type MemoryProfile struct {
	// PeakHeapBytes is the heap held, with the collector off, after every
	// payload was copied (as a broker client hands it over) and decoded,
	// with the geometries kept: payloads, parse intermediates and go-geom
	// coordinates all coexist, as they do when a full budget is admitted
	// at once and the collector has not run yet.
	PeakHeapBytes int64 `json:"peak_heap_bytes"`
	// RetainedHeapBytes is the heap still held after a collection, with
	// the payloads and geometries still referenced: the floor under
	// PeakHeapBytes once the intermediates are gone.
	RetainedHeapBytes int64 `json:"retained_heap_bytes"`
	// RSSBytes is how much the process's resident set grew over the same
	// span; 0 where it cannot be read (outside Linux). It counts whatever
	// else the process maps meanwhile too: page-granular heap growth and,
	// under the race detector, its shadow memory.
	RSSBytes int64 `json:"rss_bytes"`
	// BytesPerVertex is the larger of PeakHeapBytes and RSSBytes, divided
	// by the sample's vertices.
	BytesPerVertex float64 `json:"bytes_per_vertex"`
}

// heapObjectsMetric is the heap occupied by objects, live or not yet swept;
// with the collector off it only grows.
const heapObjectsMetric = "/memory/classes/heap/objects:bytes"

// MeasureBytesPerVertex measures the memory a sample's geometry takes while
// it is in flight, per vertex. Every payload is copied (the copy stands for
// the message body the broker client allocated) and decoded with [cost.Decode],
// and all copies and geometries are kept, so the raw bytes, the parser's
// intermediates and the go-geom coordinates coexist. The heap growth is read
// with runtime/metrics and cross-checked against the growth of the
// process's RSS; the larger one, divided by the vertex count, is the result.
// For GeoJSON it is several times the 16 bytes two float64 ordinates take.
//
// The collector is switched off (and the soft memory limit lifted) while the
// sample is held and switched back before returning, so the process needs
// memory for the whole sample's peak at once: use a sample of a few MB to a
// few hundred MB. Measurements are serialized; allocation by other goroutines
// in the meantime is counted too, so measure in a quiet process (at start-up
// or in the spillway tool), not in a busy consumer.
//
// A payload that does not decode fails the measurement with an error naming
// its index; so does a sample without vertices.
func MeasureBytesPerVertex(s *Sample) (MemoryProfile, error) {
	vertices := s.totalVertices()
	if vertices <= 0 {
		return MemoryProfile{}, errEmptySample
	}
	measureMu.Lock()
	defer measureMu.Unlock()

	// Start from a collected heap whose free pages went back to the OS, so
	// the pages the sample needs are faulted in and show up in the RSS.
	debug.FreeOSMemory()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))

	sample := []metrics.Sample{{Name: heapObjectsMetric}}
	heap := func() int64 {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(sample[0].Value.Uint64())
	}

	held := make([]any, 0, 2*len(s.Payloads))
	rss0 := residentBytes()
	heap0 := heap()
	for i, p := range s.Payloads {
		body := bytes.Clone(p)
		g, err := cost.Decode(body)
		if err != nil {
			return MemoryProfile{}, fmt.Errorf("sizing: measuring payload %d: %w", i, err)
		}
		held = append(held, body, g)
	}
	peak := heap() - heap0
	rss := residentBytes() - rss0
	if rss0 == 0 {
		rss = 0
	}
	runtime.GC()
	retained := heap() - heap0
	runtime.KeepAlive(held)

	m := MemoryProfile{
		PeakHeapBytes:     max(peak, 0),
		RetainedHeapBytes: max(retained, 0),
		RSSBytes:          max(rss, 0),
	}
	m.BytesPerVertex = float64(max(m.PeakHeapBytes, m.RSSBytes)) / float64(vertices)
	return m, nil
}

// residentBytes returns the process's resident set size, or 0 if it cannot
// be read.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	// statm: size resident shared text lib data dt, in pages.
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// Option configures [MeasureThroughput] ([WithParallelism], [WithRepeats],
// [WithProgress]) or an [AutoSizer] ([WithOnResize]). An option given
// where it does not apply is ignored.
type Option func(*options)

// options are what the package's Options set.
type options struct {
	parallelism int
	repeats     int
	progress    func(done, total int64)
	onResize    func(from, to int64, b Bounds)
}

// WithParallelism runs n handlers at once (default GOMAXPROCS). Use the
// number of handlers production runs at once in one process: with Kafka the
// partitions a process is assigned, with Redis Streams its consumers. n <= 0
// is ignored.
func WithParallelism(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.parallelism = n
		}
	}
}

// WithRepeats runs the sample k times and reports the median rate (default
// 5), so a single GC pause or a noisy neighbour cannot set the budget. k <= 0
// is ignored.
func WithRepeats(k int) Option {
	return func(o *options) {
		if k > 0 {
			o.repeats = k
		}
	}
}

// WithProgress calls f after every payload with the vertices processed so far
// over all repeats and their total. Calls are serialized and done never
// decreases; f must be fast, it runs on a measuring goroutine.
func WithProgress(f func(done, total int64)) Option {
	return func(o *options) { o.progress = f }
}

// MeasureThroughput measures how many vertices per second handler processes
// on the sample's payloads, with the parallelism production uses
// ([Inputs.VerticesPerSecond]), and how much more a slow vertex of the mix
// costs than the average one ([Inputs.Spread]).
//
// Each run starts a fixed pool of goroutines (WithParallelism, default
// GOMAXPROCS) that take payloads from a shared queue and call handler on
// each, and divides the sample's vertices by the run's wall time. Payloads
// are queued largest first, so the end of a run is not one big geometry
// running alone on an otherwise idle machine: the rate is the one a
// continuous stream sees. The collector runs between runs, outside the
// timing. The rate is the median of the runs (WithRepeats, default 5).
//
// The spread is the 95th percentile, by vertices, of the payloads' handler
// seconds per vertex, divided by the sample's mean (all handler seconds
// over all vertices). 1 means every payload costs the same per vertex; 2.5
// means the slowest 5 % of the vertices cost 2.5 times the mean or more.
// Each payload's time is its median over the runs. Weighting by vertices
// keeps a one-vertex payload, whose time is all overhead, from counting as
// slow geometry.
//
// handler must be the real handler body (decode plus work), called directly,
// not through a router or any shared event loop whose scheduling would be
// timed too. It may be called concurrently. The first error it returns (or
// panic, as an error that says so) stops the measurement and is returned
// wrapped, naming the payload; so is ctx.Err() if ctx ends first. A sample
// without vertices fails. MeasureThroughput may be called from several
// goroutines, but measurements running at once compete for the same cores
// and measure each other: run them one after another.
func MeasureThroughput(ctx context.Context, s *Sample, handler func(ctx context.Context, payload []byte) error, opts ...Option) (verticesPerSecond, spread float64, err error) {
	vertices := s.totalVertices()
	if vertices <= 0 {
		return 0, 0, errEmptySample
	}
	if handler == nil {
		return 0, 0, errors.New("sizing: MeasureThroughput: nil handler")
	}
	cfg := options{parallelism: runtime.GOMAXPROCS(0), repeats: 5}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}

	// Largest first; the sort is stable, so ties keep the sample's order.
	order := make([]int, len(s.Payloads))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return s.Vertices[b] - s.Vertices[a] })

	var (
		progressMu sync.Mutex
		done       int64
		total      = vertices * int64(cfg.repeats)
	)
	report := func(n int) {
		if cfg.progress == nil {
			return
		}
		progressMu.Lock()
		done += int64(n)
		cfg.progress(done, total)
		progressMu.Unlock()
	}

	runs := make([]float64, 0, cfg.repeats)
	took := make([][]float64, len(s.Payloads)) // each payload's handler seconds, per run
	for range cfg.repeats {
		runtime.GC()
		elapsed, err := runOnce(ctx, s, order, handler, cfg.parallelism, report, took)
		if err != nil {
			return 0, 0, err
		}
		runs = append(runs, float64(vertices)/max(elapsed.Seconds(), 1e-9))
	}
	return median(runs), spreadOf(s.Vertices, took), nil
}

// spreadQuantile is the share of the vertices at or below the per-vertex
// cost MeasureThroughput's spread reports.
const spreadQuantile = 0.95

// spreadOf computes MeasureThroughput's spread from each payload's vertices
// and handler times. Payloads without vertices are left out; 0 if nothing
// is left.
func spreadOf(vertices []int, took [][]float64) float64 {
	type payload struct {
		vertices  float64
		perVertex float64
	}
	var (
		ps            []payload
		secs, vertSum float64
	)
	for i, v := range vertices {
		if v <= 0 || len(took[i]) == 0 {
			continue
		}
		d := median(took[i])
		ps = append(ps, payload{float64(v), d / float64(v)})
		secs += d
		vertSum += float64(v)
	}
	if len(ps) == 0 || secs <= 0 {
		return 0
	}
	slices.SortFunc(ps, func(a, b payload) int { return cmp.Compare(a.perVertex, b.perVertex) })
	var acc float64
	q := ps[len(ps)-1].perVertex
	for _, p := range ps {
		acc += p.vertices
		if acc >= spreadQuantile*vertSum {
			q = p.perVertex
			break
		}
	}
	return q / (secs / vertSum)
}

// runOnce processes every payload once with p workers and returns the wall
// time.
// took[i] gets payload i's handler time appended; each payload is handled
// by one worker, so the slices are not shared.
func runOnce(ctx context.Context, s *Sample, order []int, handler func(context.Context, []byte) error, p int, report func(int), took [][]float64) (time.Duration, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range min(p, len(order)) {
		wg.Go(func() {
			for ctx.Err() == nil {
				k := int(next.Add(1) - 1)
				if k >= len(order) {
					return
				}
				i := order[k]
				began := time.Now()
				if err := callHandler(ctx, handler, s.Payloads[i]); err != nil {
					cancel(fmt.Errorf("sizing: handler failed on payload %d: %w", i, err))
					return
				}
				took[i] = append(took[i], time.Since(began).Seconds())
				report(s.Vertices[i])
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := context.Cause(ctx); err != nil {
		return 0, err
	}
	return elapsed, nil
}

// callHandler calls handler, turning a panic into an error.
func callHandler(ctx context.Context, handler func(context.Context, []byte) error, payload []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("sizing: handler panicked: %v", r)
		}
	}()
	return handler(ctx, payload)
}

// median returns the median of xs (the mean of the middle two for an even
// count) without reordering xs; 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}
