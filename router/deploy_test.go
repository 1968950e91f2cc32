package router

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway/telemetry"
)

// TestDeployManifestsQueryExportedSeries: the autoscaling manifests in
// deploy/ (KEDA, and a plain HPA through the Prometheus Adapter) parse as
// YAML and query only metric and label names that a router on Kafka and on
// Redis really exports through the OpenTelemetry Prometheus exporter; the
// HPA asks for the external metric the adapter rules define, by labels
// that metric's series have.
func TestDeployManifestsQueryExportedSeries(t *testing.T) {
	exported := map[string]map[string]bool{} // Prometheus name -> label names
	for _, name := range []string{"kafka", "redis"} {
		for metric, labels := range exportedSeries(t, name) {
			if exported[metric] == nil {
				exported[metric] = map[string]bool{}
			}
			for l := range labels {
				exported[metric][l] = true
			}
		}
	}

	var keda struct {
		Kind string
		Spec struct {
			Triggers []struct {
				Type       string
				MetricType string `yaml:"metricType"`
				Metadata   map[string]string
			}
		}
	}
	readYAML(t, "keda/scaledobject.yaml", &keda)
	if keda.Kind != "ScaledObject" || len(keda.Spec.Triggers) == 0 {
		t.Fatalf("keda/scaledobject.yaml: kind %q with %d triggers, want a ScaledObject with a trigger", keda.Kind, len(keda.Spec.Triggers))
	}
	for _, tr := range keda.Spec.Triggers {
		if tr.Type != "prometheus" || tr.MetricType != "AverageValue" {
			t.Errorf("keda trigger: type %q, metricType %q, want prometheus, AverageValue", tr.Type, tr.MetricType)
		}
		if v, err := strconv.ParseFloat(tr.Metadata["threshold"], 64); err != nil || v <= 0 {
			t.Errorf("keda trigger: threshold %q, want seconds > 0", tr.Metadata["threshold"])
		}
		checkQuery(t, "keda/scaledobject.yaml", tr.Metadata["query"], exported)
	}

	var rules struct {
		ExternalRules []struct {
			SeriesQuery  string `yaml:"seriesQuery"`
			MetricsQuery string `yaml:"metricsQuery"`
			Name         struct{ As string }
		} `yaml:"externalRules"`
	}
	readYAML(t, "hpa/prometheus-adapter-rules.yaml", &rules)
	if len(rules.ExternalRules) == 0 {
		t.Fatal("hpa/prometheus-adapter-rules.yaml: no externalRules")
	}
	seriesOf := map[string]string{} // external metric -> the metric its series are
	for _, r := range rules.ExternalRules {
		checkQuery(t, "adapter seriesQuery", r.SeriesQuery, exported)
		// The adapter puts the HPA's selector where <<.LabelMatchers>> is.
		checkQuery(t, "adapter metricsQuery", strings.ReplaceAll(r.MetricsQuery, "<<.LabelMatchers>>", `group="g"`), exported)
		if m := promSelector.FindStringSubmatch(r.SeriesQuery); m != nil {
			seriesOf[r.Name.As] = m[1]
		}
	}

	var hpa struct {
		Kind string
		Spec struct {
			Metrics []struct {
				Type     string
				External struct {
					Metric struct {
						Name     string
						Selector struct {
							MatchLabels map[string]string `yaml:"matchLabels"`
						}
					}
					Target struct {
						Type         string
						AverageValue string `yaml:"averageValue"`
					}
				}
			}
		}
	}
	readYAML(t, "hpa/hpa.yaml", &hpa)
	if hpa.Kind != "HorizontalPodAutoscaler" || len(hpa.Spec.Metrics) == 0 {
		t.Fatalf("hpa/hpa.yaml: kind %q with %d metrics", hpa.Kind, len(hpa.Spec.Metrics))
	}
	for _, m := range hpa.Spec.Metrics {
		ext := m.External
		series, ok := seriesOf[ext.Metric.Name]
		if m.Type != "External" || !ok {
			t.Errorf("hpa metric %s %q: want External, named as an adapter rule (%v)", m.Type, ext.Metric.Name, seriesOf)
			continue
		}
		for l := range ext.Metric.Selector.MatchLabels {
			if !exported[series][l] {
				t.Errorf("hpa selects label %q, which %s does not have (%v)", l, series, exported[series])
			}
		}
		if ext.Target.Type != "AverageValue" || ext.Target.AverageValue == "" {
			t.Errorf("hpa target %+v, want AverageValue in seconds", ext.Target)
		}
	}
}

var (
	// A series selector: metric name and optional label matchers.
	promSelector = regexp.MustCompile(`\b(spillway_[a-z_]+)\b(\{[^}]*\})?`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	promBy       = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
)

// checkQuery reports each metric of query that is not exported, each label
// matcher on a label its metric lacks, and each grouping label that none
// of the query's metrics has.
func checkQuery(t *testing.T, where, query string, exported map[string]map[string]bool) {
	t.Helper()
	sels := promSelector.FindAllStringSubmatch(query, -1)
	if len(sels) == 0 {
		t.Errorf("%s: no spillway metric in %q", where, query)
	}
	all := map[string]bool{}
	for _, s := range sels {
		labels, ok := exported[s[1]]
		if !ok {
			t.Errorf("%s: %s is not exported (exported: %v)", where, s[1], slices.Sorted(mapKeys(exported)))
			continue
		}
		for l := range labels {
			all[l] = true
		}
		for _, m := range promMatcher.FindAllStringSubmatch(s[2], -1) {
			if !labels[m[1]] {
				t.Errorf("%s: %s has no label %q (%v)", where, s[1], m[1], slices.Sorted(mapKeys(labels)))
			}
		}
	}
	for _, by := range promBy.FindAllStringSubmatch(query, -1) {
		for l := range strings.SplitSeq(by[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !all[l] {
				t.Errorf("%s: groups by %q, a label none of its metrics has", where, l)
			}
		}
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func readYAML(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "deploy", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("deploy/%s: %v", name, err)
	}
}

// exportedSeries runs a router on the broker of brokerCases named name
// with the OpenTelemetry Prometheus exporter, drains a few pings, builds
// a backlog, and returns the spillway_ series the registry then holds,
// with their label names.
func exportedSeries(t *testing.T, name string) map[string]map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	var cfg Config
	for _, bc := range brokerCases {
		if bc.name == name {
			cfg = bc.config(t)
		}
	}
	cfg.CloseTimeout = 10 * time.Second
	cfg.Kafka.Partitions = 2
	cfg.Telemetry.LagInterval = time.Hour // sampled below
	r, err := New(cfg, nil, WithTelemetry(telemetry.WithMeterProvider(mp)))
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
	if _, err := r.AddConsumerHandler("parcels", "parcels", func(*message.Message) error {
		if hold.Load() {
			<-release
			return nil
		}
		handled.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	startRouter(t, r)
	ctx := context.Background()
	for i := range 20 {
		if err := r.Publisher().Publish("parcels", message.NewMessage("p-"+strconv.Itoa(i), pingPayload(i))); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); handled.Load() < 20 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(minRateWindow)
	hold.Store(true)
	for i := range 5 {
		if err := r.Publisher().Publish("parcels", message.NewMessage("q-"+strconv.Itoa(i), pingPayload(i))); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if lag, err := r.Lag(ctx); err == nil && lag == 5 {
			break
		}
	}
	if err := r.lagSampler.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "spillway_") {
			continue
		}
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		out[f.GetName()] = labels
	}
	for _, want := range []string{"spillway_backlog_vertices", "spillway_drain_rate_per_second", "spillway_drain_time_seconds"} {
		if _, ok := out[want]; !ok {
			t.Errorf("%s: %s not exported", name, want)
		}
	}
	unblock()
	return out
}
