package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/sizing"
	"github.com/spillway-go/spillway/telemetry"
)

// The /metrics endpoint, served the way docs/operations.md shows, answers
// with the budget and lag series under their documented Prometheus names.
func TestPrometheusEndpoint(t *testing.T) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp),
		telemetry.WithTopicFunc(func(*message.Message) string { return "parcels" }))
	if err != nil {
		t.Fatal(err)
	}
	budget := mustVertexBudget(1000, middleware.WithLanes(middleware.Lane{Name: "light", MaxCharge: 100, Reserve: 0.1},
		middleware.Lane{Name: "heavy"}))
	if _, err := m.ObserveBudget("geo", budget); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ObserveBounds("geo", func() sizing.Bounds {
		return sizing.Bounds{MemoryBound: 2000, DeadlineBound: 1000, Budget: 1000, Binding: "deadline"}
	}); err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{}
	src.set(nil, kafkaLag(0, 6), kafkaLag(1, 0))
	sampler := telemetry.NewLagSampler(src.Lag, telemetry.WithLagThreshold(100))
	if err := sampler.Sample(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ObserveLag("kafka", sampler); err != nil {
		t.Fatal(err)
	}
	// One message through the middleware and every outcome counter once.
	admission, _ := middleware.New(budget, middleware.WithOnAdmission(m.OnAdmission))
	h := m.Middleware(admission.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil }))
	msg := message.NewMessage("x", []byte("p"))
	msg.Metadata.Set("vertex_count", "10")
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"shed", "superseded", "deferred", "dead_lettered", "released_on_rebalance"} {
		m.Count(context.Background(), o, "parcels", "r", 1)
	}

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()
	resp, err := client.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	text := string(body)

	for _, want := range []string{
		`spillway_budget_capacity{budget="geo",`,
		`spillway_budget_in_use{budget="geo",`,
		`spillway_budget_fill_ratio{budget="geo",`,
		`spillway_budget_waiting{budget="geo",`,
		`spillway_budget_saturated_seconds{budget="geo",`,
		`spillway_budget_admitted_total{budget="geo",`,
		`spillway_budget_lane_in_use{budget="geo",lane="light",`,
		`spillway_budget_lane_fill_ratio{budget="geo",lane="heavy",`,
		`spillway_budget_lane_waiting{budget="geo",lane="light",`,
		`spillway_budget_lane_saturated_seconds{budget="geo",lane="heavy",`,
		`spillway_budget_lane_wait_seconds_total{budget="geo",lane="light",`,
		`spillway_budget_lane_admitted_vertices_total{budget="geo",lane="light",`,
		`spillway_budget_bound{bound="deadline",budget="geo",`,
		`spillway_budget_binding{bound="deadline",budget="geo",`,
		`spillway_consumer_lag{group="workers",`,
		`partition="0",topic="parcels"} 6`,
		`spillway_consumer_lag_saturated_seconds{`,
		`spillway_consumer_lag_sample_age_seconds{`,
		`spillway_consumer_lag_errors_total{`,
		`spillway_process_duration_seconds_bucket{`,
		`spillway_process_vertices_bucket{`,
		`spillway_admission_wait_seconds_bucket{admission="admitted",`,
		`spillway_admission_charges_total{`,
		`spillway_processed_messages_total{`,
		`spillway_processed_vertices_total{`,
		`spillway_messages_shed_total{`,
		`spillway_messages_superseded_total{`,
		`spillway_messages_deferred_total{`,
		`spillway_messages_dead_lettered_total{`,
		`spillway_messages_released_on_rebalance_total{`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if testing.Verbose() {
		// The exposed names, for docs/operations.md.
		names := map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^# TYPE (spillway_\S+) (\S+)`).FindAllStringSubmatch(text, -1) {
			names[m[1]+" "+m[2]] = true
		}
		var list []string
		for n := range names {
			list = append(list, n)
		}
		sort.Strings(list)
		t.Logf("exposed:\n%s", strings.Join(list, "\n"))
	}
}

// mustVertexBudget is middleware.NewVertexBudget for capacities the test knows
// are valid.
func mustVertexBudget(capacity int64, opts ...middleware.Option) *middleware.VertexBudget {
	b, err := middleware.NewVertexBudget(capacity, opts...)
	if err != nil {
		panic(err)
	}
	return b
}
