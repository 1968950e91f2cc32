// Command kafka is the Spillway demo: a mixed stream of point pings, real
// polygons and heavy multipolygons assembled from them, every message
// stamped with its vertex_count, consumed through the Spillway router by a
// CPU-bound reference handler (area, centroid and convex hull with go-geom's
// xy package) under a vertex budget.
//
// The polygons come from -data: NDJSON files of GeoJSON features, one
// feature a line, comma-separated. The default names the repository's two
// samples (countries and US counties) relative to its root, so run it from
// there or point -data at your own files.
//
// It runs against an embedded Kafka broker by default. Set KAFKA_BROKERS
// (host:port,host:port) for a real cluster; the topic is created with
// kafka.partitions partitions if it is missing. Every router setting can be
// overridden with SPILLWAY_* variables or a YAML file named by
// SPILLWAY_CONFIG (docs/router.md), the broker included: with
// SPILLWAY_BROKER=redis the same program runs on Redis Streams, on an
// in-process server unless SPILLWAY_REDIS_ADDR names a real one.
//
//	go run ./examples/kafka
//	KAFKA_BROKERS=localhost:9092 go run ./examples/kafka
//	SPILLWAY_BROKER=redis go run ./examples/kafka
//	SPILLWAY_BROKER=redis SPILLWAY_REDIS_ADDR=127.0.0.1:6379 go run ./examples/kafka
//	go run ./examples/kafka -metrics-addr 127.0.0.1:9464   # Prometheus /metrics
//	go run ./examples/kafka -data my-features.ndjson
//
// It prints progress once a second and a summary at the end, and exits 0
// once every message has been processed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/encoding/wkb"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	_ "github.com/spillway-go/spillway/embedded" // kafka.brokers / redis.addr "embedded"
	"github.com/spillway-go/spillway/examples/geo"
	"github.com/spillway-go/spillway/router"
	"github.com/spillway-go/spillway/telemetry"
)

const (
	topic       = "geo.events"
	defaultData = "testdata/countries-land-10km.ndjson,testdata/us-counties-10m.ndjson"
)

func main() {
	os.Exit(run())
}

type settings struct {
	data                     string
	pings, polygons, heavies int
	heavyVertices            int
	passes                   int
	verbose                  bool
	metricsAddr              string
}

func run() int {
	var s settings
	flag.StringVar(&s.data, "data", defaultData, "NDJSON files of GeoJSON features, comma-separated")
	flag.IntVar(&s.pings, "pings", 3000, "point pings in the stream")
	flag.IntVar(&s.polygons, "polygons", 400, "real polygons from -data in the stream")
	flag.IntVar(&s.heavies, "heavies", 24, "heavy multipolygons assembled from -data polygons")
	flag.IntVar(&s.heavyVertices, "heavy-vertices", 30000, "vertices per heavy multipolygon")
	flag.IntVar(&s.passes, "passes", 0, "work passes per message (0: calibrate for a run of about 20 s)")
	flag.BoolVar(&s.verbose, "v", false, "log Watermill and Sarama at info level")
	flag.StringVar(&s.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://<addr>/metrics (host:port, port 0 for any; empty: off)")
	flag.Parse()

	cfg, err := config()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}

	features, polygons, err := loadGeometry(s.data)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stream, err := buildStream(s, features, polygons)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var totalVertices int64
	for _, m := range stream {
		totalVertices += int64(m.vertices)
	}

	// Calibrate the reference handler on this machine, then size the
	// budget from it: drain within half the redelivery deadline.
	sample, err := wkb.Marshal(assemble(polygons, 0, s.heavyVertices), wkb.NDR)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	perPass := timeOne(sample, 1)
	if s.passes <= 0 {
		// About 20 s of work on all cores.
		budgetCPU := 20 * time.Second * time.Duration(runtime.GOMAXPROCS(0))
		perVertexPass := float64(perPass) / float64(s.heavyVertices)
		s.passes = max(1, int(float64(budgetCPU)/(perVertexPass*float64(totalVertices))))
	}
	rate := float64(s.heavyVertices) / (perPass.Seconds() * float64(s.passes)) * float64(runtime.GOMAXPROCS(0))
	if os.Getenv("SPILLWAY_BUDGET_VERTICES") == "" {
		// The deadline bound: what drains within half the deadline.
		cfg.Budget.Vertices = max(1, int64(rate*cfg.RedeliveryDeadline().Seconds()*0.5))
	}

	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if s.verbose {
		logger = watermill.NewStdLogger(false, false)
	}
	var ropts []router.Option
	if s.metricsAddr != "" {
		ms, err := serveMetrics(s.metricsAddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "metrics:", err)
			return 1
		}
		defer ms.Close()
		ropts = append(ropts, router.WithTelemetry(telemetry.WithMeterProvider(ms.provider)))
		fmt.Printf("metrics: %s\n", ms.url)
	}
	r, err := router.New(cfg, logger, ropts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if cfg.Broker == "redis" {
		fmt.Printf("spillway demo: broker redis %s, stream %s, %d consumers, idle-claim after %s\n",
			cfg.Redis.Addr, topic, cfg.Redis.Consumers, cfg.RedeliveryDeadline())
	} else {
		fmt.Printf("spillway demo: broker %s %v, topic %s, %d partitions, rebalance timeout %s\n",
			cfg.Broker, cfg.Kafka.Brokers, topic, cfg.Kafka.Partitions, cfg.Kafka.RebalanceTimeout)
	}
	fmt.Printf("stream: %d messages, %d vertices (%d pings, %d polygons, %d heavies of ~%d vertices)\n",
		len(stream), totalVertices, s.pings, s.polygons, s.heavies, s.heavyVertices)
	fmt.Printf("handler: %d passes of area+centroid+hull, ~%.0f vertices/s on %d cores; budget %d vertices (drains in half of %s)\n",
		s.passes, rate, runtime.GOMAXPROCS(0), cfg.Budget.Vertices, cfg.RedeliveryDeadline())

	d := newDemo(r, s.passes, len(stream))
	if _, err := r.AddConsumerHandler("reference", topic, d.handle); err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = r.Close()
		return 1
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	<-r.Running()

	start := time.Now()
	pubErr := make(chan error, 1)
	go func() { pubErr <- publish(r.Publisher(), stream) }()
	go d.progress(ctx, start)

	interrupted := false
	select {
	case <-d.done:
	case err := <-pubErr:
		if err != nil {
			fmt.Fprintln(os.Stderr, "publish:", err)
			cancel()
			<-runErr
			return 1
		}
		select {
		case <-d.done:
		case err := <-runErr:
			interrupted = true
			runErr <- err
		}
	case err := <-runErr:
		interrupted = true
		runErr <- err
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-runErr; err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
	}
	d.summary(elapsed)
	if interrupted {
		return 130
	}
	return 0
}

// config loads the router configuration: SPILLWAY_CONFIG and SPILLWAY_*
// first, then the demo's defaults where nothing was set.
func config() (router.Config, error) {
	if os.Getenv("SPILLWAY_BROKER") == "redis" && os.Getenv("SPILLWAY_REDIS_ADDR") == "" && os.Getenv("SPILLWAY_CONFIG") == "" {
		// Like Kafka, Redis runs in process unless told otherwise.
		os.Setenv("SPILLWAY_REDIS_ADDR", "embedded") //nolint:errcheck // cannot fail for a valid name
	}
	cfg, err := router.LoadConfig(os.Getenv("SPILLWAY_CONFIG"))
	if err != nil {
		return cfg, err
	}
	if os.Getenv("SPILLWAY_BROKER") == "" {
		cfg.Broker = "kafka"
	}
	if b := os.Getenv("KAFKA_BROKERS"); b != "" {
		cfg.Kafka.Brokers = strings.Split(b, ",")
		cfg.Kafka.CreateTopics = true
	} else if len(cfg.Kafka.Brokers) == 0 {
		// The demo runs in process unless told otherwise.
		cfg.Kafka.Brokers = []string{spillway.Embedded}
	}
	if os.Getenv("SPILLWAY_KAFKA_REBALANCE_TIMEOUT") == "" {
		// A demo-sized deadline, so the budget is small enough to see.
		cfg.Kafka.RebalanceTimeout = 6 * time.Second
	}
	if cfg.Broker == "redis" {
		if os.Getenv("SPILLWAY_REDIS_MAX_IDLE_TIME") == "" {
			// The same demo-sized deadline: the idle-claim time, with the
			// keep-alive refreshing held entries well inside it.
			cfg.Redis.MaxIdleTime = 6 * time.Second
			if os.Getenv("SPILLWAY_REDIS_KEEP_ALIVE_INTERVAL") == "" {
				cfg.Redis.KeepAlive.Interval = 2 * time.Second
			}
		}
	}
	if os.Getenv("SPILLWAY_CLOSE_TIMEOUT") == "" {
		cfg.CloseTimeout = 10 * time.Second
	}
	return cfg, cfg.Validate()
}

type streamMessage struct {
	uuid     string
	key      string
	kind     string
	payload  []byte
	vertices int
}

// loadGeometry reads the features in data (see geo.Load) as GeoJSON,
// and decodes every polygon among them, to assemble heavy multipolygons
// from.
func loadGeometry(data string) ([]geo.Feature, []*geom.Polygon, error) {
	features, err := geo.Load(data)
	if err != nil {
		return nil, nil, err
	}
	var polygons []*geom.Polygon
	for _, f := range features {
		g, err := cost.Decode(f.Geometry)
		if err != nil {
			return nil, nil, fmt.Errorf("feature %s: %w", f.ID, err)
		}
		switch g := g.(type) {
		case *geom.Polygon:
			polygons = append(polygons, g)
		case *geom.MultiPolygon:
			for i := range g.NumPolygons() {
				polygons = append(polygons, g.Polygon(i))
			}
		}
	}
	if len(polygons) == 0 {
		return nil, nil, fmt.Errorf("%s: no polygons to assemble heavy multipolygons from", data)
	}
	return features, polygons, nil
}

// assemble returns a multipolygon of at least minVertices vertices made of
// consecutive real polygons, starting at start.
func assemble(polygons []*geom.Polygon, start, minVertices int) *geom.MultiPolygon {
	mp := geom.NewMultiPolygon(geom.XY)
	for i, n := start, 0; n < minVertices; i++ {
		p := polygons[i%len(polygons)]
		if err := mp.Push(p); err != nil {
			panic(err) // same layout throughout: cannot happen
		}
		n += cost.Vertices(p)
	}
	return mp
}

// buildStream mixes pings, real polygons and heavy multipolygons in a
// random but reproducible order.
func buildStream(s settings, features []geo.Feature, polygons []*geom.Polygon) ([]streamMessage, error) {
	rng := rand.New(rand.NewPCG(1, 2))
	var out []streamMessage
	for i := range s.pings {
		lon, lat := rng.Float64()*360-180, rng.Float64()*170-85
		p := fmt.Appendf(nil, `{"type":"Point","coordinates":[%.5f,%.5f]}`, lon, lat)
		out = append(out, streamMessage{key: "vehicle-" + strconv.Itoa(i%50), kind: "ping", payload: p, vertices: 1})
	}
	for range s.polygons {
		f := features[rng.IntN(len(features))]
		out = append(out, streamMessage{key: "feature-" + f.ID, kind: "polygon", payload: f.Geometry, vertices: f.Vertices})
	}
	for i := range s.heavies {
		mp := assemble(polygons, rng.IntN(len(polygons)), s.heavyVertices)
		p, err := wkb.Marshal(mp, wkb.NDR)
		if err != nil {
			return nil, err
		}
		out = append(out, streamMessage{key: "region-" + strconv.Itoa(i), kind: "heavy", payload: p, vertices: cost.Vertices(mp)})
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	for i := range out {
		out[i].uuid = fmt.Sprintf("%s-%05d", out[i].kind, i)
	}
	return out, nil
}

func publish(pub message.Publisher, stream []streamMessage) error {
	const batch = 50
	for i := 0; i < len(stream); i += batch {
		var msgs []*message.Message
		for _, m := range stream[i:min(i+batch, len(stream))] {
			msg := message.NewMessage(m.uuid, m.payload)
			msg.Metadata.Set("entity_id", m.key)
			msgs = append(msgs, msg)
		}
		// The router's publisher stamps vertex_count on each message.
		if err := pub.Publish(topic, msgs...); err != nil {
			return err
		}
	}
	return nil
}

// timeOne is the fastest of three runs of the reference handler on payload.
func timeOne(payload []byte, passes int) time.Duration {
	best := time.Duration(1<<63 - 1)
	for range 3 {
		start := time.Now()
		if _, err := geo.Work(payload, passes); err != nil {
			panic(err)
		}
		best = min(best, time.Since(start))
	}
	return best
}

type demo struct {
	r      *router.Router
	passes int
	total  int

	processed atomic.Int64
	vertices  atomic.Int64
	done      chan struct{}
	doneOnce  sync.Once

	mu     sync.Mutex
	seen   map[string]bool
	dups   int
	maxLag int64
}

func newDemo(r *router.Router, passes, total int) *demo {
	return &demo{r: r, passes: passes, total: total, done: make(chan struct{}), seen: make(map[string]bool, total)}
}

func (d *demo) handle(msg *message.Message) error {
	// The reference handler: decode, then area, centroid and convex hull
	// (go-geom's xy package), d.passes times.
	if _, err := geo.Work(msg.Payload, d.passes); err != nil {
		return fmt.Errorf("processing %s: %w", msg.UUID, err)
	}
	n, _ := cost.ParseCount(msg.Metadata.Get(cost.MetadataKey), len(msg.Payload))
	d.vertices.Add(n)
	d.mu.Lock()
	if d.seen[msg.UUID] {
		d.dups++
	}
	d.seen[msg.UUID] = true
	unique := len(d.seen)
	d.mu.Unlock()
	d.processed.Add(1)
	if unique == d.total {
		d.doneOnce.Do(func() { close(d.done) })
	}
	return nil
}

func (d *demo) progress(ctx context.Context, start time.Time) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastVerts int64
	last := start
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.done:
			return
		case now := <-tick.C:
			v := d.vertices.Load()
			rate := float64(v-lastVerts) / now.Sub(last).Seconds()
			lastVerts, last = v, now
			st := d.r.Stats()
			lag := "n/a"
			lctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			if l, err := d.r.Lag(lctx); err == nil {
				lag = strconv.FormatInt(l, 10)
				d.mu.Lock()
				d.maxLag = max(d.maxLag, l)
				d.mu.Unlock()
			} else if !errors.Is(err, router.ErrLagUnknown) {
				lag = "?"
			}
			cancel()
			fmt.Printf("%5.1fs  messages %5d/%d  %8.0f vertices/s  budget %7d/%d (%3.0f%%)  waiters %2d  longest wait %6s  lag %s\n",
				now.Sub(start).Seconds(), d.processed.Load(), d.total, rate,
				st.Budget.InUse, st.Budget.Capacity, 100*float64(st.Budget.InUse)/float64(st.Budget.Capacity), st.Budget.Waiting,
				st.Budget.OldestWait.Round(time.Millisecond), lag)
		}
	}
}

func (d *demo) summary(elapsed time.Duration) {
	st := d.r.Stats()
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Println("---")
	fmt.Printf("processed %d of %d messages (%d distinct, %d duplicates), %d vertices in %s: %.0f vertices/s\n",
		d.processed.Load(), d.total, len(d.seen), d.dups, d.vertices.Load(), elapsed.Round(10*time.Millisecond),
		float64(d.vertices.Load())/elapsed.Seconds())
	b := st.Budget
	fmt.Printf("budget: capacity %d, peak in use %d (%.0f%%), %d admitted (mean wait %s), %d clamped\n",
		b.Capacity, b.PeakInUse, 100*float64(b.PeakInUse)/float64(b.Capacity), b.Admitted,
		meanWait(b.TotalWait, b.Admitted), b.Clamped)
	fmt.Printf("revocations %d, cancellations %d, late commits %d, evictions %d, peak lag %d\n",
		st.Revocations, st.Cancellations, st.LateMarks, st.Evictions, d.maxLag)
}

func meanWait(total time.Duration, n uint64) time.Duration {
	if n == 0 {
		return 0
	}
	return (total / time.Duration(n)).Round(time.Millisecond)
}
