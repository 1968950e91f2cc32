package router

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/telemetry"
)

// warningLogger keeps the router's warnings: Info lines whose message
// starts with "spillway: warning:".
type warningLogger struct {
	watermill.NopLogger
	mu    sync.Mutex
	lines []string
}

func (l *warningLogger) Info(msg string, _ watermill.LogFields) {
	if strings.HasPrefix(msg, "spillway: warning:") {
		l.mu.Lock()
		l.lines = append(l.lines, msg)
		l.mu.Unlock()
	}
}

func (l *warningLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// about returns the warnings that mention topic, quoted.
func (l *warningLogger) about(topic string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.lines {
		if strings.Contains(s, strconv.Quote(topic)) {
			out = append(out, s)
		}
	}
	return out
}

// chargeCounts returns spillway.admission.charges by "topic/source".
func chargeCounts(t *testing.T, reader sdkmetric.Reader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "spillway.admission.charges" {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				t.Fatalf("spillway.admission.charges is %T", m.Data)
			}
			for _, p := range sum.DataPoints {
				topic, _ := p.Attributes.Value(attribute.Key("topic"))
				source, _ := p.Attributes.Value(attribute.Key("source"))
				out[topic.AsString()+"/"+source.AsString()] += p.Value
			}
		}
	}
	return out
}

// Issue 32: messages without a usable vertex_count are each charged the
// whole budget and run one at a time, silently. The router now logs one
// warning per topic the first time it charges a message of that topic the
// default cost, counts the charges by source (spillway.admission.charges,
// Stats), and says what to do.
func TestUnstampedWarnedOncePerTopic(t *testing.T) {
	for _, computeMissing := range []bool{false, true} {
		t.Run(fmt.Sprintf("compute_missing=%v", computeMissing), func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			defer func() { _ = mp.Shutdown(context.Background()) }()
			cfg := Config{Broker: brokerMemory}
			cfg.Budget.Vertices = 1_000
			cfg.Budget.ComputeMissing = computeMissing
			logs := &warningLogger{}
			r, err := New(cfg, logs, WithTelemetry(telemetry.WithMeterProvider(mp)))
			if err != nil {
				t.Fatal(err)
			}
			var handled atomic.Int64
			for _, topic := range []string{"parcels", "roads"} {
				if _, err := r.AddConsumerHandler(topic, topic, func(*message.Message) error {
					handled.Add(1)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			startRouter(t, r)

			pub := r.back.publisher() // raw: not stamped
			sent := 0
			send := func(topic string, payload, count string) {
				msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
				if count != "" {
					msg.Metadata.Set(cost.MetadataKey, count)
				}
				if err := pub.Publish(topic, msg); err != nil {
					t.Fatal(err)
				}
				sent++
			}
			const point = `{"type":"Point","coordinates":[1,2]}`
			for range 5 {
				send("parcels", "not geometry", "") // missing
			}
			send("parcels", "not geometry", "many") // malformed
			send("parcels", point, "1")             // stamped
			send("parcels", point, "1")
			send("parcels", point, "") // computed with compute_missing, else missing
			for range 3 {
				send("roads", "not geometry", "")
			}
			waitFor(t, "every message handled", func() bool { return handled.Load() == int64(sent) })

			for _, topic := range []string{"parcels", "roads"} {
				lines := logs.about(topic)
				if len(lines) != 1 {
					t.Fatalf("warnings about %q: %q, want exactly one", topic, lines)
				}
				t.Log(lines[0])
				// GoChannel hands messages over in no fixed order, so
				// the first of parcels may be its malformed one.
				if !strings.Contains(lines[0], "carry no vertex_count") &&
					(topic != "parcels" || !strings.Contains(lines[0], "carry a malformed vertex_count")) {
					t.Errorf("warning about %q does not say what its messages carry: %s", topic, lines[0])
				}
				for _, want := range []string{"the whole budget (1000 vertices), so they run one at a time", "cost.NewStampingPublisher"} {
					if !strings.Contains(lines[0], want) {
						t.Errorf("warning about %q lacks %q: %s", topic, want, lines[0])
					}
				}
				if advice := strings.Contains(lines[0], "or set budget.compute_missing"); advice == computeMissing {
					t.Errorf("compute_missing %v, advice to set it %v: %s", computeMissing, advice, lines[0])
				}
			}

			want := map[string]int64{"parcels/missing": 6, "parcels/malformed": 1, "parcels/header": 2, "roads/missing": 3}
			wantStats := [2]uint64{10, 0} // defaulted, computed
			if computeMissing {
				want["parcels/missing"], want["parcels/computed"] = 5, 1
				wantStats = [2]uint64{9, 1}
			}
			got := chargeCounts(t, reader)
			for k, n := range want {
				if got[k] != n {
					t.Errorf("spillway.admission.charges %s = %d, want %d (all: %v)", k, got[k], n, got)
				}
			}
			if len(got) != len(want) {
				t.Errorf("spillway.admission.charges = %v, want %v", got, want)
			}
			s := r.Stats()
			if [2]uint64{s.Defaulted, s.Computed} != wantStats {
				t.Errorf("Stats: Defaulted %d, Computed %d; want %v", s.Defaulted, s.Computed, wantStats)
			}
		})
	}
}

// Issue 32: oversize refusals were dead-lettered without a word. The
// router now logs them at most once per topic and interval, naming the
// limit, its value and what to do; the next line after the interval says
// how many were refused in between.
func TestOversizeWarnedOncePerInterval(t *testing.T) {
	cfg := Config{Broker: brokerMemory}
	cfg.Budget.Vertices = 10_000
	cfg.Budget.MaxPayloadBytes = 4 << 10
	cfg.Budget.MaxMessageVertices = 1_000
	cfg.Telemetry.Disabled = true
	logs := &warningLogger{}
	r, err := New(cfg, logs)
	if err != nil {
		t.Fatal(err)
	}
	r.oversizeLog.setEvery(time.Hour)
	var handled atomic.Int64
	for _, topic := range []string{"shapes", "roads"} {
		if _, err := r.AddConsumerHandler(topic, topic, func(*message.Message) error {
			handled.Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var dead atomic.Int64
	for _, topic := range []string{"shapes.dead_letter", "roads.dead_letter"} {
		sub, _, err := r.back.subscriber("watch-"+topic, topic)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for m := range ch {
				dead.Add(1)
				m.Ack()
			}
		}()
	}
	startRouter(t, r)

	pub := r.back.publisher()
	send := func(topic string, payload []byte, vertices int) {
		msg := message.NewMessage(watermill.NewUUID(), payload)
		msg.Metadata.Set(cost.MetadataKey, strconv.Itoa(vertices))
		if err := pub.Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		send("shapes", []byte(`{}`), 5_000)
	}
	for range 3 {
		send("roads", []byte(`{}`), 2_000)
	}
	waitFor(t, "23 messages dead-lettered", func() bool { return dead.Load() == 23 })

	shapes := logs.about("shapes")
	if len(shapes) != 1 {
		t.Fatalf("warnings about shapes: %q, want one for 20 refusals within the interval", shapes)
	}
	for _, want := range []string{"charge of 5000 vertices", "budget.max_message_vertices 1000", `"shapes.dead_letter"`,
		"raise budget.max_message_vertices, or set budget.oversize_topic"} {
		if !strings.Contains(shapes[0], want) {
			t.Errorf("warning lacks %q: %s", want, shapes[0])
		}
	}
	if strings.Contains(shapes[0], "more refused") {
		t.Errorf("first warning counts suppressed lines: %s", shapes[0])
	}
	if roads := logs.about("roads"); len(roads) != 1 || !strings.Contains(roads[0], "charge of 2000 vertices") {
		t.Errorf("warnings about roads: %q, want one of its own", roads)
	}

	// The interval has passed: the next refusal is logged, with the count.
	r.oversizeLog.setEvery(time.Nanosecond)
	send("shapes", make([]byte, 8<<10), 1)
	waitFor(t, "the 24th message dead-lettered", func() bool { return dead.Load() == 24 })
	shapes = logs.about("shapes")
	if len(shapes) != 2 {
		t.Fatalf("warnings about shapes: %q, want a second one after the interval", shapes)
	}
	t.Logf("%s\n%s", shapes[0], shapes[1])
	for _, want := range []string{"payload of 8192 bytes", "budget.max_payload_bytes 4096", "(19 more refused since the last such line)"} {
		if !strings.Contains(shapes[1], want) {
			t.Errorf("second warning lacks %q: %s", want, shapes[1])
		}
	}
	if n := handled.Load(); n != 0 {
		t.Errorf("handler ran %d times; every message was oversize", n)
	}
}

// topicNotices logs the first event of each topic, then at most one per
// interval with the count of those it did not log; with no interval, only
// the first.
func TestTopicNotices(t *testing.T) {
	t0 := time.Unix(1_000, 0)
	var n topicNotices
	n.setEvery(time.Minute)
	type step struct {
		topic      string
		at         time.Duration
		log        bool
		suppressed int64
	}
	for i, s := range []step{
		{"a", 0, true, 0},
		{"a", time.Second, false, 0},
		{"b", 2 * time.Second, true, 0},
		{"a", 59 * time.Second, false, 0},
		{"a", 60 * time.Second, true, 2},
		{"a", 61 * time.Second, false, 0},
		{"b", 3 * time.Minute, true, 0},
		{"a", 3 * time.Minute, true, 1},
	} {
		logIt, k := n.note(s.topic, t0.Add(s.at))
		if logIt != s.log || k != s.suppressed {
			t.Errorf("step %d (%s at %v): note = %v, %d; want %v, %d", i, s.topic, s.at, logIt, k, s.log, s.suppressed)
		}
	}
	var once topicNotices
	for i := range 3 {
		if logIt, _ := once.note("a", t0.Add(time.Duration(i)*time.Hour)); logIt != (i == 0) {
			t.Errorf("no interval, event %d logged %v", i, logIt)
		}
	}
}
