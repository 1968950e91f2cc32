package router

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/spillway-go/spillway/telemetry"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
)

// series returns, per metric name, each data point's value by its
// attribute set (one string of key=value pairs).
func series(t *testing.T, reader sdkmetric.Reader) map[string]map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	put := func(name string, set attribute.Set, v float64) {
		if out[name] == nil {
			out[name] = map[string]float64{}
		}
		key := ""
		for _, kv := range set.ToSlice() {
			if kv.Key != "budget" {
				key += string(kv.Key) + "=" + kv.Value.String() + " "
			}
		}
		out[name][key] = v
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, float64(p.Value))
				}
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, float64(p.Value))
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, p.Value)
				}
			}
		}
	}
	return out
}

// Issue 13, item 14: the layers that had only Stats export their work:
// the producer section's waits, the retry budget's tokens and the Redis
// keep-alive's refreshes and holdings.
func TestEdgeInternalsExported(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	cfg := redisConfig(t)
	cfg.Producer.RateLimit = ProducerRateLimitConfig{VerticesPerSecond: 50, Burst: 10}
	cfg.Redis.KeepAlive.Interval = 50 * time.Millisecond
	r, err := New(cfg, nil, WithTelemetry(telemetry.WithMeterProvider(mp)))
	if err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}, 8), make(chan struct{})
	if _, err := r.AddConsumerHandler("h", "shapes", func(*message.Message) error {
		held <- struct{}{}
		<-release
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	// Three 5-vertex polygons against a burst of 10 at 50/s: the third
	// waits for the limiter.
	for i := range 3 {
		publishCosted(t, r, "shapes", "m"+string(rune('a'+i)), 5)
	}
	<-held
	time.Sleep(300 * time.Millisecond) // a few keep-alive refreshes
	got := series(t, reader)
	close(release)
	closeRouter(t, r, errc)

	if w := got["spillway.producer.wait"]["limiter=rate_limit "]; w <= 0 {
		t.Errorf("spillway.producer.wait{limiter=rate_limit} = %v, want > 0 (series %v)", w, got["spillway.producer.wait"])
	}
	if _, ok := got["spillway.producer.rejected"][""]; !ok {
		t.Errorf("spillway.producer.rejected missing: %v", got["spillway.producer.rejected"])
	}
	if tok, ok := got["spillway.retry.tokens"][""]; !ok || tok <= 0 {
		t.Errorf("spillway.retry.tokens = %v (present %v), want > 0", tok, ok)
	}
	if n := got["spillway.redis.keep_alive.tracked"][""]; n < 1 {
		t.Errorf("spillway.redis.keep_alive.tracked = %v, want ≥ 1 (a held entry)", n)
	}
	if n := got["spillway.redis.keep_alive.refreshed"][""]; n < 1 {
		t.Errorf("spillway.redis.keep_alive.refreshed = %v, want ≥ 1", n)
	}
	for _, reason := range []string{"claimed", "expired", "revoked"} {
		if _, ok := got["spillway.redis.keep_alive.lost"]["reason="+reason+" "]; !ok {
			t.Errorf("spillway.redis.keep_alive.lost{reason=%s} missing: %v", reason, got["spillway.redis.keep_alive.lost"])
		}
	}
}

// The slot learns its handler's name from the first message that carries
// one and keeps it; a context without one is not remembered. Its tracker
// is looked up again whenever the router's trackers change.
func TestHandlerNameCached(t *testing.T) {
	r, err := New(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctxs := make(chan context.Context, 2)
	for _, name := range []string{"first", "second"} {
		if _, err := r.AddConsumerHandler(name, name, func(msg *message.Message) error {
			ctxs <- msg.Context()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	startRouter(t, r)
	publishCosted(t, r, "first", "a", 1)
	first := <-ctxs
	publishCosted(t, r, "second", "b", 1)
	second := <-ctxs

	var n handlerName
	if got := n.of(context.Background()); got != "" || n.p.Load() != nil {
		t.Fatalf("a context without a name: %q, remembered %v", got, n.p.Load())
	}
	if got := n.of(first); got != "first" {
		t.Fatalf("first message: %q, want first", got)
	}
	if got := n.of(second); got != "first" {
		t.Fatalf("a later message: %q, want the remembered first", got)
	}

	// The tracker follows the router's trackers: looked up again after
	// each change, whatever the slot remembered.
	var tn handlerName
	if tr := tn.trackerOf(first, r); tr != nil {
		t.Fatalf("no tracker set: got %v", tr)
	}
	one, two := &namedTracker{"one"}, &namedTracker{"two"}
	r.mu.Lock()
	r.setTracker("first", one)
	r.mu.Unlock()
	for range 2 {
		if tr := tn.trackerOf(first, r); tr != one {
			t.Fatalf("tracker %v, want one", tr)
		}
	}
	r.mu.Lock()
	r.setTracker("first", two)
	r.mu.Unlock()
	if tr := tn.trackerOf(second, r); tr != two {
		t.Fatalf("after a change: tracker %v, want two", tr)
	}
	r.mu.Lock()
	r.setTracker("first", nil)
	r.mu.Unlock()
	if tr := tn.trackerOf(first, r); tr != nil {
		t.Fatalf("after removal: tracker %v, want none", tr)
	}
}

// namedTracker is a deliveryTracker that does nothing.
type namedTracker struct{ name string }

func (*namedTracker) Revoked(*message.Message) <-chan struct{} { return nil }
func (*namedTracker) Begin(*message.Message)                   {}
func (*namedTracker) Completed(*message.Message)               {}
func (*namedTracker) Redelivered(*message.Message) bool        { return false }

// The settling layer allocates each message's first delivery context at
// the top of the stack; the slot takes it through the contexts the layers
// between made, once: a later attempt (the retry gate's) gets a delivery
// of its own, never the earlier attempt's again.
func TestSlottedDelivery(t *testing.T) {
	type key struct{}
	c := &slotted{Context: context.Background()}
	below := context.WithValue(c, key{}, "v")
	first := newDelivery(below)
	if first != &c.d {
		t.Fatal("the first attempt did not get the settling layer's delivery")
	}
	if again := newDelivery(below); again == first || again == nil {
		t.Fatal("a second attempt got the first attempt's delivery")
	}
	if d := newDelivery(context.Background()); d == nil || d == first {
		t.Fatal("without a slotted context: no new delivery")
	}
}

// inFlight returns how many messages are in s's stack, not counting those
// held at the shutdown gate.
func (s *settling) inFlight() int64 {
	n := -s.held.Load()
	for i := range s.shards {
		n += s.shards[i].inside.Load()
	}
	return n
}
