package router

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/geodata"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/telemetry"
)

// TestBacklogAccuracy: a consumer drains pings (1 vertex each), then stops
// while a backlog of real country boundaries (1,000 vertices and more
// each, so 1:1,000 and beyond) and as many more pings builds up, the
// heavies shuffled among the pings or behind them: 40 behind 1,000 pings,
// and 120 behind 3,000, more than an estimate reads on either broker. Router.Backlog estimates the backlog's vertices within ±25 % of the
// stamped truth, where "lag × average charge of the recent messages" is
// off by orders of magnitude; the drain rate comes from the pings drained,
// and the estimate is exported as spillway.backlog.vertices, with
// spillway.drain.rate and spillway.drain.time = vertices ÷ rate.
func TestBacklogAccuracy(t *testing.T) {
	var big []geodata.Feature
	all, err := geodata.Load(geodata.Countries)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range all {
		if f.Vertices >= 1000 {
			big = append(big, f)
		}
	}
	if len(big) == 0 {
		t.Fatal("no country of 1,000 vertices or more in the test data")
	}
	for _, tc := range []struct {
		name, order    string
		pings, heavies int
	}{
		// Read in full by an estimate.
		{"kafka", "shuffled", 1000, 40}, {"kafka", "heavies-last", 1000, 40},
		{"redis", "shuffled", 1000, 40}, {"redis", "heavies-last", 1000, 40},
		// Sampled: more bytes (Kafka) or entries (Redis) than an
		// estimate reads.
		{"kafka", "shuffled", 3000, 120}, {"kafka", "heavies-last", 3000, 120},
		{"redis", "shuffled", 3000, 120},
	} {
		name, pings, heavies := tc.name, tc.pings, tc.heavies
		t.Run(fmt.Sprintf("%s/%s/%d", name, tc.order, pings+heavies), func(t *testing.T) {
			defer goleak.VerifyNone(t, leakOptions...)
			var bc brokerCase
			for _, c := range brokerCases {
				if c.name == name {
					bc = c
				}
			}
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			defer func() { _ = mp.Shutdown(context.Background()) }()
			cfg := bc.config(t)
			cfg.CloseTimeout = 10 * time.Second
			cfg.Telemetry.LagInterval = time.Hour // the test samples itself
			// One partition: its backlog (1.5 MB and more) is more than
			// an estimate reads, so it is sampled.
			cfg.Kafka.Partitions = 1
			r, err := New(cfg, nil, WithTelemetry(telemetry.WithMeterProvider(mp)))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var handled, handledVertices atomic.Int64
			var hold atomic.Bool
			release := make(chan struct{})
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			defer unblock()
			if _, err := r.AddConsumerHandler("drain", "shapes", func(msg *message.Message) error {
				if hold.Load() {
					<-release
					return nil
				}
				n, _ := cost.ParseCount(msg.Metadata.Get(cost.MetadataKey), len(msg.Payload))
				handled.Add(1)
				handledVertices.Add(n)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			startRouter(t, r)
			ctx := context.Background()
			publish := func(payload []byte, i int) int64 {
				t.Helper()
				msg := message.NewMessage("m-"+strconv.Itoa(i), payload)
				if err := r.Publisher().Publish("shapes", msg); err != nil {
					t.Fatal(err)
				}
				n, src := cost.ParseCount(msg.Metadata.Get(cost.MetadataKey), len(msg.Payload))
				if src != cost.SourceHeader {
					t.Fatalf("message %d not stamped: %q", i, msg.Metadata.Get(cost.MetadataKey))
				}
				return n
			}
			waitLag := func(want int64) {
				t.Helper()
				var lag int64
				var err error
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					if lag, err = r.Lag(ctx); err == nil && lag == want {
						return
					}
				}
				t.Fatalf("Lag = %d (%v), want %d", lag, err, want)
			}

			// The recent past: pings only.
			for i := range pings {
				publish(pingPayload(i), i)
			}
			for deadline := time.Now().Add(30 * time.Second); handled.Load() < int64(pings) && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			waitLag(0)
			time.Sleep(minRateWindow) // a full window of drain rate
			recentAverage := float64(handledVertices.Load()) / float64(handled.Load())

			// The backlog: heavies shuffled among pings.
			hold.Store(true)
			payloads := make([][]byte, 0, pings+heavies)
			for i := range pings {
				payloads = append(payloads, pingPayload(i))
			}
			for i := range heavies {
				payloads = append(payloads, big[i%len(big)].Geometry)
			}
			if tc.order == "shuffled" {
				rand.New(rand.NewPCG(36, 1)).Shuffle(len(payloads), func(i, j int) { payloads[i], payloads[j] = payloads[j], payloads[i] })
			}
			var truth int64
			for i, p := range payloads {
				truth += publish(p, pings+i)
			}
			waitLag(int64(pings + heavies))

			backlog, err := r.Backlog(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rate := r.Stats().DrainRate
			var estimate, messages int64
			for _, b := range backlog {
				estimate += b.Vertices
				messages += b.Lag
			}
			relErr := float64(estimate-truth) / float64(truth)
			naive := float64(messages) * recentAverage
			t.Logf("%s, %s: backlog %d messages, %d vertices; estimated %d (error %+.1f%%); lag × recent average %.0f (error %+.1f%%); drain rate %.0f vertices/s",
				name, tc.order, messages, truth, estimate, 100*relErr, naive, 100*(naive-float64(truth))/float64(truth), rate)
			if messages != int64(pings+heavies) {
				t.Errorf("lag = %d, want %d", messages, pings+heavies)
			}
			if math.Abs(relErr) > 0.25 {
				t.Errorf("estimated %d vertices for a backlog of %d: error %+.1f%%, want within ±25%%", estimate, truth, 100*relErr)
			}
			if math.Abs(naive-float64(truth)) <= 0.25*float64(truth) {
				t.Errorf("lag × recent average (%.0f) is within 25%% of %d: the backlog is not skewed enough to tell", naive, truth)
			}
			if rate <= 0 {
				t.Fatalf("DrainRate = %v after %d vertices drained, want > 0", rate, handledVertices.Load())
			}

			// The same estimate, from the sampler, as metrics.
			if err := r.lagSampler.Sample(ctx); err != nil {
				t.Fatal(err)
			}
			if got := collect(t, reader, metricBacklogVertices)["shapes"]; got != estimate {
				t.Errorf("%s = %d, want %d", metricBacklogVertices, got, estimate)
			}
			exportedRate := collectFloat(t, reader, metricDrainRate)
			if exportedRate <= 0 {
				t.Fatalf("%s = %v, want > 0", metricDrainRate, exportedRate)
			}
			want := float64(estimate) / exportedRate
			if got := collectFloat(t, reader, metricDrainTime); math.Abs(got-want) > 0.01*want {
				t.Errorf("%s = %v, want %v (backlog vertices ÷ drain rate)", metricDrainTime, got, want)
			}
			unblock()
		})
	}
}

// collectFloat sums the data points of the float gauge name.
func collectFloat(t *testing.T, reader sdkmetric.Reader, name string) float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			g, ok := m.Data.(metricdata.Gauge[float64])
			if !ok {
				t.Fatalf("%s is %T", name, m.Data)
			}
			for _, p := range g.DataPoints {
				sum += p.Value
			}
		}
	}
	return sum
}

// TestBacklogDrainRateIsAutoSizerThroughput: with budget.autosize on, the
// drain rate in Stats is the auto-sizer's measured throughput.
func TestBacklogDrainRateIsAutoSizerThroughput(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := redisConfig(t)
	cfg.CloseTimeout = 10 * time.Second
	cfg.Telemetry.Disabled = true
	cfg.Budget.Vertices = 10_000
	a := &cfg.Budget.AutoSize
	a.Enabled = true
	a.Window, a.Windows, a.MinWindows = 30*time.Millisecond, 1, 1
	a.Ceiling = 1_000_000
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var handled atomic.Int64
	var hold atomic.Bool
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	if _, err := r.AddConsumerHandler("drain", "shapes", func(*message.Message) error {
		if hold.Load() {
			<-release
			return nil
		}
		time.Sleep(2 * time.Millisecond)
		handled.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	startRouter(t, r)
	ctx := context.Background()
	publish := func(from, n int, payload func(i int) []byte) {
		for i := from; i < from+n; i++ {
			if err := r.Publisher().Publish("shapes", message.NewMessage("m-"+strconv.Itoa(i), payload(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	heavy := geojsonPayload(t, heavyGeometry(t, 0, 500))
	publish(0, 100, func(int) []byte { return heavy })
	for deadline := time.Now().Add(30 * time.Second); handled.Load() < 100 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	hold.Store(true)
	publish(100, 50, pingPayload)
	var b telemetry.LagSample
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && b.Lag != 50; time.Sleep(50 * time.Millisecond) {
		backlog, err := r.Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range backlog {
			if x.Topic == "shapes" {
				b = x
			}
		}
	}
	if b.Lag != 50 {
		t.Fatalf("Backlog of shapes = %+v, want a lag of 50", b)
	}
	st := r.Stats()
	want := st.AutoSize.VerticesPerSecond
	t.Logf("auto-sizer throughput %.0f vertices/s; backlog %d vertices", want, b.Vertices)
	if want <= 0 {
		t.Fatalf("the auto-sizer measured no throughput after %d messages", handled.Load())
	}
	if st.DrainRate != want {
		t.Errorf("DrainRate = %v, want the auto-sizer's %v", st.DrainRate, want)
	}
	if b.Vertices != 50 {
		t.Errorf("Vertices = %d, want 50 (one per ping)", b.Vertices)
	}
	unblock()
}

// TestBacklogSamplerEstimatesOwnedPartitions: on Kafka, each process's lag
// sampler estimates, and exports, the backlog of the partitions the group
// assigned to it only, so that N processes read each partition once rather
// than N times; between them they cover every partition. Router.Backlog
// still estimates every partition.
func TestBacklogSamplerEstimatesOwnedPartitions(t *testing.T) {
	for _, mode := range []string{"partition", "key"} {
		t.Run(mode, func(t *testing.T) {
			defer goleak.VerifyNone(t, leakOptions...)
			const topic = "owned-parts"
			group := "owned-" + mode
			broker := kafkatest.Start(t, 2) // one cluster for both routers
			type member struct {
				r      *Router
				reader *sdkmetric.ManualReader
			}
			start := func() member {
				t.Helper()
				reader := sdkmetric.NewManualReader()
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
				t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
				cfg := Config{Broker: brokerKafka, ConsumerGroup: group}
				cfg.Kafka.Brokers = broker.Brokers()
				cfg.Kafka.Partitions = 2
				cfg.Kafka.CreateTopics = true
				cfg.Kafka.HeartbeatInterval = 100 * time.Millisecond
				cfg.Kafka.Consumer = mode
				cfg.CloseTimeout = 10 * time.Second
				cfg.Telemetry.LagInterval = time.Hour // the test samples itself
				r, err := New(cfg, nil, WithTelemetry(telemetry.WithMeterProvider(mp)))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := r.AddConsumerHandler("h", topic, func(*message.Message) error { return nil }); err != nil {
					t.Fatal(err)
				}
				startRouter(t, r)
				return member{r, reader}
			}
			// exported returns the partitions of topic m's sampler exports
			// a backlog for.
			exported := func(m member) []int64 {
				t.Helper()
				if err := m.r.lagSampler.Sample(context.Background()); err != nil {
					t.Fatal(err)
				}
				var rm metricdata.ResourceMetrics
				if err := m.reader.Collect(context.Background(), &rm); err != nil {
					t.Fatal(err)
				}
				var parts []int64
				for _, sm := range rm.ScopeMetrics {
					for _, met := range sm.Metrics {
						if met.Name != metricBacklogVertices {
							continue
						}
						for _, p := range met.Data.(metricdata.Gauge[int64]).DataPoints {
							if v, _ := p.Attributes.Value("topic"); v.AsString() != topic {
								continue
							}
							v, _ := p.Attributes.Value("partition")
							parts = append(parts, v.AsInt64())
						}
					}
				}
				slices.Sort(parts)
				return parts
			}
			waitFor := func(what string, ok func() bool) {
				t.Helper()
				for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("after 30 s: %s", what)
					}
				}
			}

			a := start()
			defer a.r.Close()
			waitFor("one member exports both partitions", func() bool { return slices.Equal(exported(a), []int64{0, 1}) })

			b := start()
			defer b.r.Close()
			var pa, pb []int64
			waitFor("two members export one partition each", func() bool {
				pa, pb = exported(a), exported(b)
				return len(pa) == 1 && len(pb) == 1 && pa[0] != pb[0]
			})
			t.Logf("member a estimates partition %v, member b %v", pa, pb)
			for _, m := range []member{a, b} {
				backlog, err := m.r.Backlog(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, s := range backlog {
					if s.Topic == topic {
						n++
					}
				}
				if n != 2 {
					t.Errorf("Router.Backlog reports %d partitions of %s, want 2", n, topic)
				}
			}
		})
	}
}
