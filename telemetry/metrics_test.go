package telemetry_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/sizing"
	"github.com/spillway-go/spillway/telemetry"
)

// Metric values match what the test drove, exactly.
func TestMetricsExactCounts(t *testing.T) {
	var handled sync.WaitGroup
	stack := newFullStack(t, 1000, func(msg *message.Message) error {
		defer handled.Done()
		if msg.Metadata.Get("fate") == "dead" {
			return errors.New("permanent")
		}
		return nil
	})
	plan := []struct {
		fate  string
		count int
	}{{"", 3}, {"shed", 2}, {"deferred", 1}, {"dead", 1}, {"superseded", 1}}
	for _, p := range plan {
		for i := range p.count {
			if p.fate == "" || p.fate == "dead" {
				handled.Add(1)
			}
			m := message.NewMessage(p.fate+strconv.Itoa(i), line4)
			if p.fate != "" {
				m.Metadata.Set("fate", p.fate)
			}
			if err := stack.pub.Publish("parcels", m); err != nil {
				t.Fatal(err)
			}
		}
	}
	topic := func(kv ...string) map[string]string {
		m := map[string]string{"topic": "parcels"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	handled.Wait()
	// The messages that never reach the handler (shed, deferred,
	// superseded) may still be on their way: wait until all 8 have left
	// the stack, or closing the router would drop them uncounted.
	waitUntil(t, "all 8 messages out of the stack", func() bool {
		rm := collect(t, stack.reader)
		var left float64
		for _, o := range []string{"handled", "shed", "deferred", "dead_lettered", "superseded"} {
			if v, ok := point(t, rm, "spillway.processed.messages", topic("outcome", o)); ok {
				left += v
			}
		}
		return left == 8
	})
	stack.router.close()

	rm := collect(t, stack.reader)
	for _, c := range []struct {
		name  string
		attrs map[string]string
		want  float64
	}{
		{"spillway.messages.shed", topic("reason", "shed_priority"), 2},
		{"spillway.messages.deferred", topic("reason", "saturated"), 1},
		{"spillway.messages.dead_lettered", topic("reason", "permanent"), 1},
		{"spillway.messages.superseded", topic("reason", "superseded"), 1},
		{"spillway.processed.messages", topic("outcome", "handled"), 3},
		{"spillway.processed.messages", topic("outcome", "shed"), 2},
		{"spillway.processed.messages", topic("outcome", "deferred"), 1},
		{"spillway.processed.messages", topic("outcome", "dead_lettered"), 1},
		{"spillway.processed.messages", topic("outcome", "superseded"), 1},
		{"spillway.processed.vertices", topic("outcome", "handled"), 12},
		{"spillway.processed.vertices", topic("outcome", "shed"), 8},
		{"spillway.process.duration", topic("outcome", "handled"), 3}, // histogram count
		{"spillway.process.vertices", topic(), 8},
		{"spillway.admission.wait", topic("admission", "admitted"), 4}, // handled + dead-lettered
	} {
		if got := mustPoint(t, rm, c.name, c.attrs); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.attrs, got, c.want)
		}
	}
	if s := histogramSum(t, rm, "spillway.process.vertices", topic()); s != 32 {
		t.Errorf("vertices histogram sum = %v, want 32", s)
	}
	if _, ok := point(t, rm, "spillway.messages.released_on_rebalance", topic("reason", "revoked")); ok {
		t.Error("nothing was released on rebalance")
	}
}

// OnShed and OnRetryOutcome, the hooks of shedding and the retry gate,
// count drops, deferrals and dead letters by topic and reason; OnShed
// labels the message's outcome, OnRetryOutcome only counts.
func TestMetricsShedAndRetryHooks(t *testing.T) {
	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp),
		telemetry.WithTopicFunc(func(*message.Message) string { return "t" }))
	if err != nil {
		t.Fatal(err)
	}
	run := func(hook func(*message.Message)) {
		h := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			hook(msg)
			return nil, nil
		})
		_, _ = h(message.NewMessage("x", []byte("payload")))
	}
	run(func(msg *message.Message) { m.OnShed(msg, "t", "stale_version") })
	run(func(msg *message.Message) { m.OnShed(msg, "t", "superseded") })
	for _, o := range []retrygate.Outcome{retrygate.Handled, retrygate.Deferred, retrygate.DeadLettered, retrygate.Nacked} {
		run(func(msg *message.Message) {
			m.OnRetryOutcome(retrygate.Event{Message: msg, Topic: "t", Outcome: o, Cause: "permanent"})
		})
	}
	m.OnRetryOutcome(retrygate.Event{Topic: "u", Outcome: retrygate.Deferred, Cause: "saturated"}) // no message

	rm := collect(t, reader)
	for _, c := range []struct {
		name  string
		attrs map[string]string
		want  float64
	}{
		{"spillway.messages.shed", map[string]string{"topic": "t", "reason": "stale_version"}, 1},
		{"spillway.messages.superseded", map[string]string{"topic": "t", "reason": "superseded"}, 1},
		{"spillway.messages.deferred", map[string]string{"topic": "t", "reason": "permanent"}, 1},
		{"spillway.messages.deferred", map[string]string{"topic": "u", "reason": "saturated"}, 1},
		{"spillway.messages.dead_lettered", map[string]string{"topic": "t", "reason": "permanent"}, 1},
		{"spillway.processed.messages", map[string]string{"topic": "t", "outcome": "shed"}, 1},
		{"spillway.processed.messages", map[string]string{"topic": "t", "outcome": "superseded"}, 1},
		{"spillway.processed.messages", map[string]string{"topic": "t", "outcome": "handled"}, 4},
	} {
		if got := mustPoint(t, rm, c.name, c.attrs); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.attrs, got, c.want)
		}
	}
}

// A revoked admission counts as released on rebalance, and a cancelled one
// labels the message; vertices fall back to the granted charge or the
// header.
func TestMetricsAdmissionOutcomes(t *testing.T) {
	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp),
		telemetry.WithTopicFunc(func(*message.Message) string { return "t" }))
	if err != nil {
		t.Fatal(err)
	}
	run := func(a *middleware.Admission, herr error) {
		h := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if a != nil {
				m.OnAdmission(msg, *a)
			}
			return nil, herr
		})
		msg := message.NewMessage("x", []byte("payload"))
		msg.Metadata.Set("vertex_count", "7")
		_, _ = h(msg)
	}
	run(&middleware.Admission{Result: middleware.Revoked, Wait: 2 * time.Second}, nil)
	run(&middleware.Admission{Result: middleware.Cancelled, Wait: time.Second}, context.Canceled)
	run(nil, errors.New("no admission, plain error"))

	rm := collect(t, reader)
	for _, c := range []struct {
		name  string
		attrs map[string]string
		want  float64
	}{
		{"spillway.messages.released_on_rebalance", map[string]string{"topic": "t", "reason": "revoked"}, 1},
		{"spillway.processed.messages", map[string]string{"topic": "t", "outcome": "released_on_rebalance"}, 1},
		{"spillway.processed.messages", map[string]string{"topic": "t", "outcome": "cancelled"}, 1},
		{"spillway.processed.messages", map[string]string{"topic": "t", "outcome": "error"}, 1},
		{"spillway.admission.wait", map[string]string{"topic": "t", "admission": "revoked"}, 1},
		{"spillway.admission.wait", map[string]string{"topic": "t", "admission": "cancelled"}, 1},
		// The admissions carried no charge source other than the zero value
		// (header), so their vertices are known: 0 each. The third message
		// falls back to its header: 7.
		{"spillway.processed.vertices", map[string]string{"topic": "t", "outcome": "error"}, 7},
	} {
		if got := mustPoint(t, rm, c.name, c.attrs); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.attrs, got, c.want)
		}
	}
	if s := histogramSum(t, rm, "spillway.admission.wait", map[string]string{"topic": "t", "admission": "revoked"}); s != 2 {
		t.Errorf("revoked wait sum = %v, want 2s", s)
	}
}

// Issue 32: spillway.admission.charges counts admitted messages by where
// their charge came from, so that unstamped traffic (charged the default
// cost, run one at a time) shows up. A message refused before it is priced
// is not counted.
func TestMetricsCountChargesBySource(t *testing.T) {
	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp),
		telemetry.WithTopicFunc(func(*message.Message) string { return "t" }))
	if err != nil {
		t.Fatal(err)
	}
	budget, err := middleware.New(mustVertexBudget(1000),
		middleware.WithEstimator(cost.NewEstimator(cost.FullBudget, cost.WithComputeMissing())),
		middleware.WithMaxPayloadBytes(1<<10),
		middleware.WithOnAdmission(m.OnAdmission),
	)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Middleware(budget.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil }))
	send := func(payload []byte, count string) {
		msg := message.NewMessage("x", payload)
		if count != "" {
			msg.Metadata.Set(cost.MetadataKey, count)
		}
		_, _ = h(msg)
	}
	send(line4, "4")                        // header
	send(line4, "4")                        // header
	send(line4, "")                         // computed from the payload
	send([]byte("not geometry"), "")        // missing: charged the default
	send([]byte("not geometry"), "x")       // malformed: charged the default
	send(make([]byte, 2<<10), "4")          // above MaxPayloadBytes: never priced
	send([]byte("not geometry either"), "") // missing

	rm := collect(t, reader)
	for source, want := range map[string]float64{"header": 2, "computed": 1, "missing": 2, "malformed": 1} {
		attrs := map[string]string{"topic": "t", "source": source}
		if got := mustPoint(t, rm, "spillway.admission.charges", attrs); got != want {
			t.Errorf("spillway.admission.charges%v = %v, want %v", attrs, got, want)
		}
	}
}

func TestMetricsPanicOutcome(t *testing.T) {
	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp),
		telemetry.WithTopicFunc(func(*message.Message) string { return "t" }))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { panic("boom") })
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the original panic", r)
			}
		}()
		_, _ = h(message.NewMessage("x", nil))
	}()
	rm := collect(t, reader)
	if got := mustPoint(t, rm, "spillway.processed.messages", map[string]string{"topic": "t", "outcome": "panic"}); got != 1 {
		t.Fatalf("panic count = %v", got)
	}
}

// Budget gauges read Stats at collection time, exactly.
func TestMetricsBudgetGauges(t *testing.T) {
	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	b := mustVertexBudget(1000)
	unregister, err := m.ObserveBudget("geo", b)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	big, _ := b.Acquire(ctx, 2000) // clamped to the capacity
	big.Release()
	p1, _ := b.Acquire(ctx, 300)
	p2, _ := b.Acquire(ctx, 200)
	waiterCtx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := b.Acquire(waiterCtx, 600)
		waited <- err
	}()
	waitUntil(t, "waiter", func() bool { return b.Stats().Waiting == 1 })

	rm := collect(t, reader)
	geo := map[string]string{"budget": "geo"}
	for name, want := range map[string]float64{
		"spillway.budget.capacity":         1000,
		"spillway.budget.in_use":           500,
		"spillway.budget.fill_ratio":       0.5,
		"spillway.budget.waiting":          1,
		"spillway.budget.waiting_vertices": 600,
		"spillway.budget.admitted":         3,
		"spillway.budget.clamped":          1,
	} {
		if got := mustPoint(t, rm, name, geo); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if sat := mustPoint(t, rm, "spillway.budget.saturated", geo); !(sat > 0) {
		t.Errorf("saturated = %v, want > 0 while someone waits", sat)
	}

	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	p1.Release()
	p2.Release()
	rm = collect(t, reader)
	if got := mustPoint(t, rm, "spillway.budget.in_use", geo); got != 0 {
		t.Errorf("in use after release = %v", got)
	}
	if got := mustPoint(t, rm, "spillway.budget.saturated", geo); got != 0 {
		t.Errorf("saturated after release = %v", got)
	}

	if err := unregister(); err != nil {
		t.Fatal(err)
	}
	rm = collect(t, reader)
	if _, ok := point(t, rm, "spillway.budget.capacity", geo); ok {
		t.Error("budget still exported after unregister")
	}
	if _, err := m.ObserveBudget("nil", nil); err == nil {
		t.Error("nil budget accepted")
	}
}

func TestMetricsBounds(t *testing.T) {
	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	bounds := sizing.Bounds{MemoryBound: 80_000, DeadlineBound: 50_000, Budget: 50_000, Binding: "deadline"}
	unregister, err := m.ObserveBounds("geo", func() sizing.Bounds {
		mu.Lock()
		defer mu.Unlock()
		return bounds
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unregister() }()

	check := func(name string, attrs map[string]string, want float64) {
		t.Helper()
		if got := mustPoint(t, collect(t, reader), name, attrs); got != want {
			t.Errorf("%s%v = %v, want %v", name, attrs, got, want)
		}
	}
	mem := map[string]string{"budget": "geo", "bound": "memory"}
	dl := map[string]string{"budget": "geo", "bound": "deadline"}
	check("spillway.budget.bound", mem, 80_000)
	check("spillway.budget.bound", dl, 50_000)
	check("spillway.budget.target", map[string]string{"budget": "geo"}, 50_000)
	check("spillway.budget.binding", dl, 1)
	check("spillway.budget.binding", mem, 0)

	mu.Lock()
	bounds = sizing.Bounds{MemoryBound: 30_000, DeadlineBound: 50_000, Budget: 30_000, Binding: "memory"}
	mu.Unlock()
	check("spillway.budget.binding", dl, 0)
	check("spillway.budget.binding", mem, 1)

	tail := map[string]string{"budget": "geo", "bound": "tail"}
	mu.Lock()
	bounds = sizing.Bounds{MemoryBound: 80_000, DeadlineBound: 50_000, TailBound: 35_000, Budget: 35_000, Binding: "tail"}
	mu.Unlock()
	check("spillway.budget.bound", tail, 35_000)
	check("spillway.budget.binding", tail, 1)
	check("spillway.budget.binding", dl, 0)

	mu.Lock()
	bounds = sizing.Bounds{Budget: 10_000, Binding: "configured"}
	mu.Unlock()
	check("spillway.budget.binding", map[string]string{"budget": "geo", "bound": "configured"}, 1)
	if _, err := m.ObserveBounds("x", nil); err == nil {
		t.Error("nil func accepted")
	}
}

// A budget split into lanes also exports spillway.budget.lane.* per lane.
func TestMetricsBudgetLanes(t *testing.T) {
	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	b, err := middleware.NewVertexBudget(1000, middleware.WithLanes(
		middleware.Lane{Name: "light", MaxCharge: 100, Reserve: 0.1}, middleware.Lane{Name: "heavy"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.ObserveBudget("geo", b); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	heavy, _ := b.Acquire(ctx, 900)
	light, _ := b.Acquire(ctx, 50)
	rm := collect(t, reader)
	for _, c := range []struct {
		name, lane string
		want       float64
	}{
		{"spillway.budget.lane.in_use", "light", 50},
		{"spillway.budget.lane.in_use", "heavy", 900},
		{"spillway.budget.lane.fill_ratio", "heavy", 0.9},
		{"spillway.budget.lane.waiting", "light", 0},
		{"spillway.budget.lane.admitted_vertices", "light", 50},
		{"spillway.budget.lane.wait", "heavy", 0},
	} {
		if got := mustPoint(t, rm, c.name, map[string]string{"budget": "geo", "lane": c.lane}); got != c.want {
			t.Errorf("%s{lane=%s} = %v, want %v", c.name, c.lane, got, c.want)
		}
	}
	if sat := mustPoint(t, rm, "spillway.budget.lane.saturated", map[string]string{"budget": "geo", "lane": "heavy"}); !(sat > 0) {
		t.Errorf("heavy lane saturated = %v, want > 0 with no room left", sat)
	}
	light.Release()
	heavy.Release()
}

// A tracing middleware that starts no span, inside a metrics middleware
// that measures, passes the admission through to the metrics' record: the
// processed vertices are the ones granted, not the header's count.
func TestAdmissionReachesTheRecordThroughAQuietTracing(t *testing.T) {
	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp),
		telemetry.WithTopicFunc(func(*message.Message) string { return "t" }))
	if err != nil {
		t.Fatal(err)
	}
	quiet := telemetry.NewTracing(telemetry.WithTracerProvider(nooptrace.NewTracerProvider()),
		telemetry.WithPropagator(propagation.TraceContext{}))
	h := m.Middleware(quiet(func(msg *message.Message) ([]*message.Message, error) {
		m.OnAdmission(msg, middleware.Admission{
			Charge:  cost.Charge{Vertices: 20, Messages: 1, Source: cost.SourceHeader},
			Granted: 20, Result: middleware.Admitted,
		})
		return nil, nil
	}))
	msg := message.NewMessage("x", []byte("{}"))
	msg.Metadata.Set("vertex_count", "5")
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	rm := collect(t, reader)
	if got := mustPoint(t, rm, "spillway.processed.vertices", map[string]string{"topic": "t", "outcome": "handled"}); got != 20 {
		t.Errorf("processed vertices = %v, want the 20 granted", got)
	}
}
