package telemetry_test

import (
	"context"
	"runtime/debug"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/spillway-go/spillway/telemetry"
)

// Spans and metrics carry the instrumentation scope's name, version and
// schema URL.
func TestScopeVersionAndSchema(t *testing.T) {
	version := telemetry.ScopeVersion()
	if version == "" {
		t.Fatal("empty instrumentation version")
	}

	tp, sr := newTracerProvider()
	pub := telemetry.NewTracingPublisher(&recorder{}, telemetry.WithTracerProvider(tp))
	if err := pub.Publish("shapes", message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	spans := sr.Ended()
	if len(spans) == 0 {
		t.Fatal("no span")
	}
	for _, s := range spans {
		sc := s.InstrumentationScope()
		if sc.Name != telemetry.ScopeName || sc.Version != version || sc.SchemaURL != semconv.SchemaURL {
			t.Errorf("span %s scope = %+v; want %s %s %s", s.Name(), sc, telemetry.ScopeName, version, semconv.SchemaURL)
		}
	}

	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	m.Count(context.Background(), "shed", "shapes", "test", 1)
	rm := collect(t, reader)
	if len(rm.ScopeMetrics) == 0 {
		t.Fatal("no metrics")
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != telemetry.ScopeName || sm.Scope.Version != version || sm.Scope.SchemaURL != semconv.SchemaURL {
			t.Errorf("metric scope = %+v; want %s %s %s", sm.Scope, telemetry.ScopeName, version, semconv.SchemaURL)
		}
	}
}

// Meter takes its provider from the package's options: an instrument a
// program adds with it is reported by that provider under Spillway's
// scope.
func TestMeterFromOptions(t *testing.T) {
	mp, reader := newMeterProvider()
	ctr, err := telemetry.Meter(telemetry.WithMeterProvider(mp), telemetry.WithMessagingSystem("kafka")).
		Int64Counter("app.parcels")
	if err != nil {
		t.Fatal(err)
	}
	ctr.Add(context.Background(), 3)
	rm := collect(t, reader)
	if len(rm.ScopeMetrics) != 1 {
		t.Fatalf("%d scopes, want 1", len(rm.ScopeMetrics))
	}
	sm := rm.ScopeMetrics[0]
	if sm.Scope.Name != telemetry.ScopeName || sm.Scope.Version != telemetry.ScopeVersion() ||
		len(sm.Metrics) != 1 || sm.Metrics[0].Name != "app.parcels" {
		t.Fatalf("scope %+v with %d metrics, want %s with app.parcels", sm.Scope, len(sm.Metrics), telemetry.ScopeName)
	}
}

// The version is the library module's, wherever it sits in the build.
func TestModuleVersion(t *testing.T) {
	const mod = "github.com/spillway-go/spillway"
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{"no build info", nil, false, "(devel)"},
		{"main module", &debug.BuildInfo{Main: debug.Module{Path: mod, Version: "v1.2.3"}}, true, "v1.2.3"},
		{"working tree", &debug.BuildInfo{Main: debug.Module{Path: mod}}, true, "(devel)"},
		{"dependency", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}, Deps: []*debug.Module{
			{Path: "github.com/other/x", Version: "v9.9.9"},
			{Path: mod, Version: "v0.4.0"},
		}}, true, "v0.4.0"},
		{"replaced", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}, Deps: []*debug.Module{
			{Path: mod, Version: "v0.4.0", Replace: &debug.Module{Path: "../spillway"}},
		}}, true, "(devel)"},
		{"replaced by a version", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}, Deps: []*debug.Module{
			{Path: mod, Version: "v0.4.0", Replace: &debug.Module{Path: "example.com/fork", Version: "v0.4.1"}},
		}}, true, "v0.4.1"},
		{"not linked", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app", Version: "v2.0.0"}}, true, "(devel)"},
	} {
		if got := telemetry.ModuleVersion(c.bi, c.ok); got != c.want {
			t.Errorf("%s: version = %q, want %q", c.name, got, c.want)
		}
	}
}
