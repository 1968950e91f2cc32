package telemetry_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitUntil polls cond until it holds or 10 s pass.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func newTracerProvider() (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	sr := tracetest.NewSpanRecorder()
	return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr)), sr
}

func newMeterProvider() (*sdkmetric.MeterProvider, *sdkmetric.ManualReader) {
	r := sdkmetric.NewManualReader()
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)), r
}

// memoryRouter runs a Watermill router over an in-memory GoChannel. The
// handler is registered for topic; mws are router-level, outermost first.
type memoryRouter struct {
	t      testing.TB
	pubSub *gochannel.GoChannel
	router *message.Router
	done   chan struct{}
}

func startMemoryRouter(t testing.TB, topic string, h message.NoPublishHandlerFunc, mws ...message.HandlerMiddleware) *memoryRouter {
	t.Helper()
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true, OutputChannelBuffer: 1024}, logger)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(mws...)
	r.AddConsumerHandler("h-"+topic, topic, pubSub, h)
	mr := &memoryRouter{t: t, pubSub: pubSub, router: r, done: make(chan struct{})}
	go func() {
		defer close(mr.done)
		if err := r.Run(context.Background()); err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	<-r.Running()
	return mr
}

func (m *memoryRouter) close() {
	if err := m.router.Close(); err != nil {
		m.t.Errorf("router close: %v", err)
	}
	<-m.done
	_ = m.pubSub.Close()
}

// attrMap flattens attributes for comparisons.
func attrMap(kvs []attribute.KeyValue) map[string]any {
	out := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		out[string(kv.Key)] = kv.Value.AsInterface()
	}
	return out
}

func spansNamed(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func spanByMessage(t testing.TB, spans []sdktrace.ReadOnlySpan, name, id string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range spansNamed(spans, name) {
		if attrMap(s.Attributes())["messaging.message.id"] == id {
			return s
		}
	}
	t.Fatalf("no span %q for message %q among %d spans", name, id, len(spans))
	return nil
}

func collect(t testing.TB, r *sdkmetric.ManualReader) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

func matches(set attribute.Set, want map[string]string) bool {
	if set.Len() != len(want) {
		return false
	}
	for k, v := range want {
		got, ok := set.Value(attribute.Key(k))
		if !ok || got.String() != v {
			return false
		}
	}
	return true
}

// point returns the value of the data point of metric name whose attributes
// are exactly want: a sum or gauge value, or a histogram's count.
func point(t testing.TB, rm metricdata.ResourceMetrics, name string, want map[string]string) (float64, bool) {
	t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		return 0, false
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				return float64(p.Value), true
			}
		}
	case metricdata.Sum[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				return p.Value, true
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				return float64(p.Value), true
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				return p.Value, true
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				return float64(p.Count), true
			}
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				return float64(p.Count), true
			}
		}
	default:
		t.Fatalf("metric %s: unexpected data %T", name, m.Data)
	}
	return 0, false
}

func mustPoint(t testing.TB, rm metricdata.ResourceMetrics, name string, want map[string]string) float64 {
	t.Helper()
	v, ok := point(t, rm, name, want)
	if !ok {
		t.Fatalf("no data point %s%v; have:\n%s", name, want, dump(rm, name))
	}
	return v
}

func histogramSum(t testing.TB, rm metricdata.ResourceMetrics, name string, want map[string]string) float64 {
	t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				return p.Sum
			}
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				return float64(p.Sum)
			}
		}
	}
	t.Fatalf("no histogram point %s%v; have:\n%s", name, want, dump(rm, name))
	return 0
}

// dump lists the data points of a metric, for failure messages.
func dump(rm metricdata.ResourceMetrics, name string) string {
	m, ok := findMetric(rm, name)
	if !ok {
		return "  (metric absent)"
	}
	var lines []string
	add := func(set attribute.Set, v any) {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, fmt.Sprintf("%s=%s", a.Key, a.Value.String()))
		}
		lines = append(lines, fmt.Sprintf("  {%s} %v", strings.Join(kv, ","), v))
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Count)
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Count)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// recorder is a publisher that remembers what it got.
type recorder struct {
	mu   sync.Mutex
	msgs []*message.Message
	err  error
}

func (r *recorder) Publish(_ string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.msgs = append(r.msgs, msgs...)
	return nil
}

func (r *recorder) Close() error { return nil }
