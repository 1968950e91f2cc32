package router

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/encoding/geojson"
	"github.com/twpayne/go-geom/encoding/wkb"
	"github.com/twpayne/go-geom/xy"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/kafkabroker"
)

// polygons returns every polygon of the US counties test data (members of
// multipolygons included), loaded once.
var polygons = sync.OnceValues(func() ([]*geom.Polygon, error) {
	f, err := os.Open(filepath.Join("..", "testdata", "us-counties-10m.ndjson"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*geom.Polygon
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		g, err := cost.Decode(sc.Bytes())
		if err != nil {
			return nil, err
		}
		switch g := g.(type) {
		case *geom.Polygon:
			out = append(out, g)
		case *geom.MultiPolygon:
			for i := 0; i < g.NumPolygons(); i++ {
				out = append(out, g.Polygon(i))
			}
		}
	}
	return out, sc.Err()
})

func testPolygons(t testing.TB) []*geom.Polygon {
	t.Helper()
	ps, err := polygons()
	if err != nil {
		t.Fatalf("loading testdata: %v", err)
	}
	return ps
}

// heavyGeometry assembles a multipolygon of at least minVertices vertices
// from real county polygons, starting at polygon start.
func heavyGeometry(t testing.TB, start, minVertices int) *geom.MultiPolygon {
	t.Helper()
	ps := testPolygons(t)
	mp := geom.NewMultiPolygon(geom.XY)
	n := 0
	for i := start; n < minVertices; i++ {
		p := ps[i%len(ps)]
		if err := mp.Push(p); err != nil {
			t.Fatal(err)
		}
		n += cost.Vertices(p)
	}
	return mp
}

func wkbPayload(t testing.TB, g geom.T) []byte {
	t.Helper()
	b, err := wkb.Marshal(g, wkb.NDR)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func geojsonPayload(t testing.TB, g geom.T) []byte {
	t.Helper()
	b, err := geojson.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pingPayload(i int) []byte {
	return fmt.Appendf(nil, `{"type":"Point","coordinates":[%d.5,%d.25]}`, i%180, i%90)
}

// work is the CPU-bound reference handler body: passes rounds of area,
// centroid and convex hull. stop is polled between rounds; work reports
// false if it gave up.
func work(g geom.T, passes int, stop func() bool) (string, bool) {
	var area, cx, cy float64
	hull := 0
	for i := 0; i < passes; i++ {
		if stop != nil && stop() {
			return "", false
		}
		switch g := g.(type) {
		case *geom.Polygon:
			area = g.Area()
		case *geom.MultiPolygon:
			area = g.Area()
		}
		if c, err := xy.Centroid(g); err == nil {
			cx, cy = c.X(), c.Y()
		}
		if h := xy.ConvexHull(g); h != nil {
			hull = cost.Vertices(h)
		}
	}
	return fmt.Sprintf("area=%.9f centroid=(%.9f,%.9f) hull=%d", area, cx, cy, hull), true
}

// timeWork returns how long one call of work(g, passes) takes, the median
// of a few runs.
func timeWork(g geom.T, passes, runs int) time.Duration {
	ds := make([]time.Duration, runs)
	for i := range ds {
		start := time.Now()
		work(g, passes, nil)
		ds[i] = time.Since(start)
	}
	for i := range ds {
		for j := i + 1; j < len(ds); j++ {
			if ds[j] < ds[i] {
				ds[i], ds[j] = ds[j], ds[i]
			}
		}
	}
	return ds[len(ds)/2]
}

// recordingLogger keeps error lines (and optionally prints everything with
// -v) so tests can look for Sarama's eviction symptoms.
type recordingLogger struct {
	watermill.LoggerAdapter
	mu     sync.Mutex
	errors []string
}

func newRecordingLogger(t testing.TB) *recordingLogger {
	return &recordingLogger{LoggerAdapter: watermill.NopLogger{}}
}

func (l *recordingLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errors = append(l.errors, msg+": "+fmt.Sprint(err))
}

func (l *recordingLogger) With(fields watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *recordingLogger) Errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errors...)
}

func xyHull(g geom.T) geom.T { return xy.ConvexHull(g) }

// kafkaTracker is the Kafka session tracker of the handler named handler,
// or nil.
func (r *Router) kafkaTracker(handler string) *kafkabroker.SessionTracker {
	tr := r.tracker(handler)
	if b, ok := tr.(blindTracker); ok {
		tr = b.deliveryTracker
	}
	t, _ := tr.(*kafkabroker.SessionTracker)
	return t
}

// chain wraps h in r's middleware stack, as Watermill would: the first
// layer outermost.
func (r *Router) chain(h message.HandlerFunc) message.HandlerFunc {
	mws := r.stack().middlewares()
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}
