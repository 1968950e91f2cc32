package sizing_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/refwork"
	"github.com/spillway-go/spillway/sizing"
)

// loadSample reads a testdata file as a sample, keeping the features for
// which keep returns true (nil: all of them).
func loadSample(tb testing.TB, file string, keep func(i, vertices int) bool) *sizing.Sample {
	tb.Helper()
	f, err := os.Open(file)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	s, err := sizing.ReadSample(f)
	if err != nil {
		tb.Fatal(err)
	}
	if keep == nil {
		return s
	}
	var payloads [][]byte
	for i, p := range s.Payloads {
		if keep(i, s.Vertices[i]) {
			payloads = append(payloads, p)
		}
	}
	sub, err := sizing.NewSample(payloads)
	if err != nil {
		tb.Fatal(err)
	}
	return sub
}

// lineString returns a GeoJSON LineString payload of n vertices.
func lineString(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"type":"LineString","coordinates":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "[%d,%d]", i, i%7)
	}
	b.WriteString("]}")
	return []byte(b.String())
}

func sampleOf(tb testing.TB, sizes ...int) *sizing.Sample {
	tb.Helper()
	payloads := make([][]byte, len(sizes))
	for i, n := range sizes {
		payloads[i] = lineString(n)
	}
	s, err := sizing.NewSample(payloads)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// refHandler adapts a reference handler to MeasureThroughput.
func refHandler(tb testing.TB, name string) func(context.Context, []byte) error {
	tb.Helper()
	fn, err := refwork.ByName(name)
	if err != nil {
		tb.Fatal(err)
	}
	return func(_ context.Context, p []byte) error {
		_, err := refwork.Process(fn, p, 1)
		return err
	}
}

// The test guards the measurement, not the number: what the measurement
// keeps alive on purpose (a copy of every payload and the decoded
// coordinates, 16 bytes per XY vertex at the very least) must show up in
// it, and so the result cannot be the naive 16 bytes per vertex.
func TestMeasureBytesPerVertexGeoJSON(t *testing.T) {
	s := loadSample(t, countriesFile, func(i, _ int) bool { return i < 120 })
	m, err := sizing.MeasureBytesPerVertex(s)
	if err != nil {
		t.Fatal(err)
	}
	vertices, size := totals(s)
	t.Logf("%d payloads, %d vertices, %d bytes: %+v", len(s.Payloads), vertices, size, m)

	floor := size + 16*vertices // the copies plus bare coordinates
	if m.RetainedHeapBytes < floor {
		t.Errorf("retained heap %d B is below what the measurement holds on purpose (%d B): the heap is not being read",
			m.RetainedHeapBytes, floor)
	}
	if m.PeakHeapBytes < m.RetainedHeapBytes {
		t.Errorf("peak heap %d B below retained %d B: the peak is not measured with the collector off",
			m.PeakHeapBytes, m.RetainedHeapBytes)
	}
	if runtime.GOOS == "linux" && m.RSSBytes == 0 {
		t.Errorf("RSS growth not measured on Linux")
	}
	top := max(m.PeakHeapBytes, m.RSSBytes)
	if want := float64(top) / float64(vertices); m.BytesPerVertex != want {
		t.Errorf("bytes per vertex %v, want the larger measurement over the vertices, %v", m.BytesPerVertex, want)
	}
	if m.BytesPerVertex <= 2*16 {
		t.Errorf("bytes per vertex %.1f: GeoJSON in flight takes far more than two float64s", m.BytesPerVertex)
	}
}

func TestMeasureRejectsEmpty(t *testing.T) {
	if _, err := sizing.MeasureBytesPerVertex(nil); !errors.Is(err, sizing.ErrEmptySample) {
		t.Errorf("MeasureBytesPerVertex(nil): %v", err)
	}
	empty, err := sizing.NewSample([][]byte{[]byte(`{"type":"Feature","geometry":null}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := sizing.MeasureThroughput(context.Background(), empty, refHandler(t, "noop")); !errors.Is(err, sizing.ErrEmptySample) {
		t.Errorf("MeasureThroughput(no vertices): %v", err)
	}
}

// With a handler that sleeps a fixed time per vertex, in a synctest bubble
// where sleeping advances a fake clock exactly, the rate is known: the
// measurement must find it, with the parallelism asked for.
func TestMeasureThroughputMechanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const perVertex = time.Millisecond
		var active, peak atomic.Int32
		calls := map[int]int{} // vertices → calls
		var mu sync.Mutex
		handler := func(_ context.Context, p []byte) error {
			n, err := cost.CountPayload(p)
			if err != nil {
				return err
			}
			a := active.Add(1)
			for {
				old := peak.Load()
				if a <= old || peak.CompareAndSwap(old, a) {
					break
				}
			}
			time.Sleep(time.Duration(n) * perVertex)
			active.Add(-1)
			mu.Lock()
			calls[n]++
			mu.Unlock()
			return nil
		}
		// Queued largest first: one worker takes the 300, the other the
		// three 100s, and the run lasts 300 ms. In sample order it would
		// last 400 ms (100 and 100 in parallel, then 300 alone).
		s := sampleOf(t, 100, 100, 300, 100)
		var last, total int64
		progress := func(done, tot int64) {
			if done < last {
				t.Errorf("progress went back from %d to %d", last, done)
			}
			last, total = done, tot
		}
		vps, _, err := sizing.MeasureThroughput(context.Background(), s, handler,
			sizing.WithParallelism(2), sizing.WithRepeats(3), sizing.WithProgress(progress))
		if err != nil {
			t.Fatal(err)
		}
		if want := 600 / 0.3; vps != want {
			t.Errorf("rate %v, want %v", vps, want)
		}
		if p := peak.Load(); p != 2 {
			t.Errorf("%d handlers ran at once, want 2", p)
		}
		if calls[100] != 9 || calls[300] != 3 {
			t.Errorf("calls by size %v, want every payload once per run", calls)
		}
		if last != 1800 || total != 1800 {
			t.Errorf("progress ended at %d of %d, want 1800 of 1800", last, total)
		}

		// The default parallelism is GOMAXPROCS (at most one handler per
		// payload), and one repeat runs every payload once.
		peak.Store(0)
		clear(calls)
		vps, _, err = sizing.MeasureThroughput(context.Background(), s, handler, sizing.WithRepeats(1))
		if err != nil {
			t.Fatal(err)
		}
		if p, want := int(peak.Load()), min(runtime.GOMAXPROCS(0), 4); p != want || calls[100] != 3 || calls[300] != 1 {
			t.Errorf("defaults: %d handlers at once (want %d), calls by size %v: %v vertices/s", p, want, calls, vps)
		}
	})
}

// Spread is the vertex-weighted 95th percentile of the cost per vertex over
// the mean. The handler sleeps 1 ms a vertex, except on payloads of odd
// size, which cost 3 ms a vertex.
func TestMeasureThroughputSpread(t *testing.T) {
	handler := func(_ context.Context, p []byte) error {
		n, err := cost.CountPayload(p)
		if err != nil {
			return err
		}
		per := time.Millisecond
		if n%2 == 1 {
			per *= 3
		}
		time.Sleep(time.Duration(n) * per)
		return nil
	}
	sizes := func(cheap, slow, slowSize int) []int {
		var out []int
		for range cheap {
			out = append(out, 100)
		}
		for range slow {
			out = append(out, slowSize)
		}
		return out
	}
	tests := []struct {
		name  string
		sizes []int
		want  float64
	}{
		// Every vertex costs the same.
		{"uniform", sizes(10, 0, 0), 1},
		// 202 of 2,002 vertices (10 %) are slow: the 95th percentile is 3 ms,
		// the mean (1,800 + 606) / 2,002 ms.
		{"slow tenth", sizes(18, 2, 101), 3 / (2406.0 / 2002)},
		// 51 of 1,851 vertices (under 5 %) are slow: the 95th percentile is
		// a cheap vertex, below the mean the slow ones raise.
		{"slow few", sizes(18, 1, 51), 1 / (1953.0 / 1851)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, spread, err := sizing.MeasureThroughput(context.Background(), sampleOf(t, tt.sizes...), handler,
					sizing.WithParallelism(3), sizing.WithRepeats(3))
				if err != nil {
					t.Fatal(err)
				}
				if math.Abs(spread-tt.want) > 1e-9 {
					t.Errorf("spread %v, want %v", spread, tt.want)
				}
			})
		})
	}
}

func TestMeasureThroughputStopsOnError(t *testing.T) {
	boom := errors.New("boom")
	s := sampleOf(t, 5, 6, 7, 8)
	var calls atomic.Int32
	_, _, err := sizing.MeasureThroughput(context.Background(), s, func(_ context.Context, p []byte) error {
		calls.Add(1)
		if n, _ := cost.CountPayload(p); n == 7 {
			return boom
		}
		return nil
	}, sizing.WithParallelism(1))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "payload 2") {
		t.Fatalf("error %v, want boom naming payload 2", err)
	}
	if c := calls.Load(); c > 4 {
		t.Fatalf("%d calls: the measurement went on after the error", c)
	}

	_, _, err = sizing.MeasureThroughput(context.Background(), s, func(_ context.Context, p []byte) error {
		if n, _ := cost.CountPayload(p); n == 6 {
			panic("kaboom")
		}
		return nil
	})
	if !strings.Contains(err.Error(), "handler panicked") || !strings.Contains(err.Error(), "kaboom") || !strings.Contains(err.Error(), "payload 1") {
		t.Fatalf("panic: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := sizing.MeasureThroughput(ctx, s, refHandler(t, "noop")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// Heavy geometry under a handler whose work per vertex grows with the
// geometry's size (here quadratic) drains fewer vertices per second, so with
// the deadline binding it gets a smaller budget than light geometry. The
// samples are measured in turns, so load on a shared machine hits both.
func TestHeavySampleGetsSmallerBudget(t *testing.T) {
	heavyCount := 0
	heavy := loadSample(t, countriesFile, func(_, n int) bool {
		if n > 1000 && n <= 1500 && heavyCount < 6 {
			heavyCount++
			return true
		}
		return false
	})
	heavyVertices, _ := totals(heavy)
	lightVertices := 0
	light := loadSample(t, countiesFile, func(_, n int) bool {
		lightVertices += n
		return lightVertices <= int(heavyVertices)
	})
	// Decode once, cross-check the segments a few times: the quadratic
	// part dominates (also under the race detector, which slows decoding
	// far more than arithmetic).
	handler := func(_ context.Context, p []byte) error {
		_, err := refwork.Process(refwork.Crossings, p, 4)
		return err
	}
	var hRuns, lRuns []float64
	for range 3 {
		for _, m := range []struct {
			s    *sizing.Sample
			runs *[]float64
		}{{heavy, &hRuns}, {light, &lRuns}} {
			vps, _, err := sizing.MeasureThroughput(context.Background(), m.s, handler, sizing.WithRepeats(1))
			if err != nil {
				t.Fatal(err)
			}
			*m.runs = append(*m.runs, vps)
		}
	}
	recommend := func(vps float64) sizing.Bounds {
		r, err := sizing.Recommend(sizing.Inputs{
			MemoryBytes: 64 << 30, BytesPerVertex: 200, VerticesPerSecond: vps, Deadline: 30 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	lightTotal, _ := totals(light)
	hVPS, lVPS := medianOf(hRuns), medianOf(lRuns)
	h, l := recommend(hVPS), recommend(lVPS)
	t.Logf("heavy: %d geometries, %d vertices, %.0f vertices/s → budget %d (%s)",
		len(heavy.Payloads), heavyVertices, hVPS, h.Budget, h.Binding)
	t.Logf("light: %d geometries, %d vertices, %.0f vertices/s → budget %d (%s)",
		len(light.Payloads), lightTotal, lVPS, l.Budget, l.Binding)
	if h.Binding != "deadline" || l.Binding != "deadline" {
		t.Fatalf("the deadline should bind both: %s, %s", h.Binding, l.Binding)
	}
	if h.Budget >= l.Budget {
		t.Errorf("heavy budget %d is not below light budget %d", h.Budget, l.Budget)
	}
}

// The recommended budget drains within the deadline: arithmetically
// (budget / rate ≤ deadline × headroom) and for real, by timing that many
// vertices through the handler with the same parallelism. The real drain
// may use the headroom (that is what it is for: tails, GC, neighbours) but
// not more than the whole deadline. A shared machine can stall one attempt,
// so up to three are made; a sizing error fails all three.
func TestRecommendedBudgetDrainsWithinDeadline(t *testing.T) {
	s := loadSample(t, countriesFile, func(i, _ int) bool { return i < 50 })
	handler := refHandler(t, "full")
	par := runtime.GOMAXPROCS(0)

	var failures []string
	for attempt := 1; attempt <= 3; attempt++ {
		vps, _, err := sizing.MeasureThroughput(context.Background(), s, handler, sizing.WithRepeats(3), sizing.WithParallelism(par))
		if err != nil {
			t.Fatal(err)
		}
		// A deadline the sample drains within at least twice over, so the
		// budget is at least the whole sample, taken in its own order; and
		// no shorter than 300 ms, so one scheduling hiccup is not most of it.
		vertices, _ := totals(s)
		deadline := time.Duration(2 * float64(vertices) / vps * float64(time.Second))
		deadline = max(deadline, 300*time.Millisecond)
		r, err := sizing.Recommend(sizing.Inputs{
			MemoryBytes: 64 << 30, BytesPerVertex: 200, VerticesPerSecond: vps, Deadline: deadline,
		})
		if err != nil {
			t.Fatal(err)
		}
		if r.Binding != "deadline" {
			t.Fatalf("memory binds: %+v", r)
		}
		budgetSecs := float64(r.Budget) / vps
		if limit := deadline.Seconds()*0.5 + 1e-6; budgetSecs > limit {
			t.Fatalf("budget %d at %.0f vertices/s takes %.3fs, more than deadline × headroom (%.3fs)",
				r.Budget, vps, budgetSecs, limit)
		}

		elapsed, drained := drain(t, s, handler, par, r.Budget)
		t.Logf("attempt %d: %.0f vertices/s, deadline %v, budget %d (%.3fs), drained %d vertices in %v",
			attempt, vps, deadline.Round(time.Millisecond), r.Budget, budgetSecs, drained, elapsed.Round(time.Millisecond))
		if drained < r.Budget {
			t.Fatalf("drained %d vertices, want at least %d", drained, r.Budget)
		}
		if elapsed <= deadline {
			return
		}
		failures = append(failures, fmt.Sprintf("attempt %d: %v > %v", attempt, elapsed, deadline))
	}
	t.Errorf("a full budget did not drain within the deadline: %v", failures)
}

// drain runs payloads from s, in order and cycling, until they add up to
// at least budget vertices, through handler with par workers, and returns
// the wall time and the vertices run.
func drain(t *testing.T, s *sizing.Sample, handler func(context.Context, []byte) error, par int, budget int64) (time.Duration, int64) {
	t.Helper()
	var work [][]byte
	var total int64
	for i := 0; total < budget; i = (i + 1) % len(s.Payloads) {
		work = append(work, s.Payloads[i])
		total += int64(s.Vertices[i])
	}
	runtime.GC()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range par {
		wg.Go(func() {
			for k := next.Add(1) - 1; k < int64(len(work)); k = next.Add(1) - 1 {
				if err := handler(context.Background(), work[k]); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), total
}

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// totals returns the vertices and bytes of s's payloads.
func totals(s *sizing.Sample) (vertices, size int64) {
	for i, p := range s.Payloads {
		vertices += int64(s.Vertices[i])
		size += int64(len(p))
	}
	return vertices, size
}
