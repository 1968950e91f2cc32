package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/shedding"
	"github.com/spillway-go/spillway/sizing"
	"github.com/spillway-go/spillway/telemetry"
)

// Function adapters for tests that listen to one event.
type (
	admissionFunc func(*message.Message, middleware.Admission)
	resizeFunc    func(from, to int64, b sizing.Bounds)
)

func (f admissionFunc) OnAdmission(msg *message.Message, a middleware.Admission) { f(msg, a) }
func (f resizeFunc) OnResize(from, to int64, b sizing.Bounds)                    { f(from, to, b) }

// hookLog is shared by the hooks of TestHooks, so it sees their order.
type hookLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *hookLog) add(format string, args ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *hookLog) matching(prefix string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.lines {
		if strings.Contains(s, prefix) {
			out = append(out, s)
		}
	}
	return out
}

// shedRetryHook has OnShed and OnRetryOutcome.
type shedRetryHook struct {
	name string
	log  *hookLog
}

func (h shedRetryHook) OnShed(msg *message.Message, topic, r string) {
	h.log.add("%s shed %s %s %s", h.name, msg.UUID, topic, r)
}

func (h shedRetryHook) OnRetryOutcome(e retrygate.Event) {
	uuid := "<nil>"
	if e.Message != nil {
		uuid = e.Message.UUID
	}
	h.log.add("%s retry %s %s %s event-uuid=%s", h.name, uuid, e.Topic, e.Outcome, uuid)
}

// allHook adds the admission and resize events to shedRetryHook.
type allHook struct{ shedRetryHook }

func (h allHook) OnAdmission(msg *message.Message, a middleware.Admission) {
	h.log.add("%s admission %s %s", h.name, msg.UUID, a.Result)
}

func (h allHook) OnResize(from, to int64, _ sizing.Bounds) {
	h.log.add("%s resize %d %d", h.name, from, to)
}

// TestHooks: a hook implementing two of the interfaces gets both events,
// each with the message it is about; two hooks are called in the order
// given; the router's metrics count the same events through the same
// dispatch.
func TestHooks(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	cfg := Config{}
	cfg.Budget.Vertices = 1_000
	cfg.Shedding.Config = shedding.Config{
		Topics:       []string{"positions"},
		Priority:     shedding.PriorityConfig{Disabled: true},
		VersionGuard: shedding.VersionGuardConfig{Enabled: true},
	}
	log := &hookLog{}
	first := shedRetryHook{"first", log}
	second := allHook{shedRetryHook{"second", log}}
	r, err := New(cfg, nil, WithTelemetry(telemetry.WithMeterProvider(mp)), WithHooks(first, nil), WithHooks(second))
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan string, 10)
	for _, topic := range []string{"positions", "jobs"} {
		if _, err := r.AddConsumerHandler(topic, topic, func(msg *message.Message) error {
			defer func() { handled <- msg.UUID }()
			if msg.UUID == "poison" {
				return retrygate.Permanent(errors.New("unreadable"))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	startRouter(t, r)

	publishCosted(t, r, "positions", "v2", 10, "entity_id", "e", "entity_version", "2")
	if got := <-handled; got != "v2" {
		t.Fatalf("handled %s first, want v2", got)
	}
	waitFor(t, "the gate to report v2", func() bool { return len(log.matching("retry v2")) == 2 })
	// The version guard holds v2 as done once it is acked, and GoChannel
	// delivers each message on its own goroutine: v1 must wait for that.
	if n, _ := r.settling.wait(time.Now().Add(10 * time.Second)); n != 0 {
		t.Fatalf("v2 not acked: %d messages unsettled", n)
	}
	publishCosted(t, r, "positions", "v1", 10, "entity_id", "e", "entity_version", "1") // stale
	publishCosted(t, r, "jobs", "poison", 10)
	if got := <-handled; got != "poison" {
		t.Fatalf("handled %s, want poison (v1 is stale)", got)
	}
	waitFor(t, "the shed and dead-letter events", func() bool {
		return len(log.matching("shed v1")) == 2 && len(log.matching("retry poison")) == 2
	})

	want := map[string][]string{
		"shed v1":      {"first shed v1 positions stale_version", "second shed v1 positions stale_version"},
		"retry v2":     {"first retry v2 positions handled event-uuid=v2", "second retry v2 positions handled event-uuid=v2"},
		"retry poison": {"first retry poison jobs dead_lettered event-uuid=poison", "second retry poison jobs dead_lettered event-uuid=poison"},
		"admission v2": {"second admission v2 admitted"},
		"admission v1": nil, // shed before it reached the budget
	}
	for k, w := range want {
		if got := log.matching(k); !slices.Equal(got, w) {
			t.Errorf("%s: hooks logged %q, want %q", k, got, w)
		}
	}

	// The metrics are the first hook of the same dispatch.
	if got := collectCounter(t, reader, "spillway.messages.shed"); got["positions/stale_version"] != 1 || len(got) != 1 {
		t.Errorf("spillway.messages.shed = %v, want positions/stale_version: 1", got)
	}
	if got := collectCounter(t, reader, "spillway.messages.dead_lettered"); got["jobs/permanent"] != 1 || len(got) != 1 {
		t.Errorf("spillway.messages.dead_lettered = %v, want jobs/permanent: 1", got)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestHookImplementingNothing: a hook that matches none of the interfaces
// (here, a misspelt method) makes New fail before it opens anything.
func TestHookImplementingNothing(t *testing.T) {
	type wrapped struct{ shedRetryHook }
	var bad struct {
		OnAdmision func(*message.Message, middleware.Admission)
	}
	for _, h := range []any{bad, 42} {
		if r, err := New(Config{}, nil, WithHooks(h)); err == nil {
			_ = r.Close()
			t.Errorf("New accepted hook %T", h)
		} else if !strings.Contains(err.Error(), "none of the hook methods") {
			t.Errorf("New with hook %T: %v", h, err)
		}
	}
	// Embedding a hook type is enough.
	r, err := New(Config{}, nil, WithHooks(wrapped{shedRetryHook{"x", &hookLog{}}}))
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
}

// collectCounter returns the int64 sum points of metric name, by
// topic/reason.
func collectCounter(t *testing.T, reader sdkmetric.Reader, name string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			s, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				t.Fatalf("%s is %T", name, m.Data)
			}
			for _, p := range s.DataPoints {
				topic, _ := p.Attributes.Value(attribute.Key("topic"))
				reason, _ := p.Attributes.Value(attribute.Key("reason"))
				out[topic.AsString()+"/"+reason.AsString()] += p.Value
			}
		}
	}
	return out
}
