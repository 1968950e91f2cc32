package telemetry

import (
	"runtime/debug"
	"sync"

	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// modulePath is the library module, whose version the scope carries.
const modulePath = "github.com/spillway-go/spillway"

// develVersion is the version of a module built from a working tree, as
// the go command reports it.
const develVersion = "(devel)"

// scopeVersion is the instrumentation version of every tracer and meter
// this package creates: the version of the library module the program was
// built with (the replacement's, when the module is replaced), from the
// binary's build information; "(devel)" when it was built from a working
// tree or a go.work, or the build information is missing.
var scopeVersion = sync.OnceValue(func() string {
	return moduleVersion(debug.ReadBuildInfo())
})

func moduleVersion(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return develVersion
	}
	v := ""
	if bi.Main.Path == modulePath {
		v = bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path != modulePath {
			continue
		}
		v = d.Version
		if d.Replace != nil {
			v = d.Replace.Version
		}
	}
	if v == "" {
		return develVersion
	}
	return v
}

// tracer returns the package's tracer from tp, with its instrumentation
// version and the schema URL of the semantic conventions its attributes
// follow.
func tracer(tp trace.TracerProvider) trace.Tracer {
	return tp.Tracer(ScopeName, trace.WithInstrumentationVersion(scopeVersion()), trace.WithSchemaURL(semconv.SchemaURL))
}

// meter is tracer's counterpart for metrics.
func meter(mp metric.MeterProvider) metric.Meter {
	return mp.Meter(ScopeName, metric.WithInstrumentationVersion(scopeVersion()), metric.WithSchemaURL(semconv.SchemaURL))
}

// Meter returns the meter Spillway's own instruments use with opts: from
// the provider of [WithMeterProvider] (the global provider without one),
// scope [ScopeName], this module's version and the semantic conventions'
// schema URL. Options other than WithMeterProvider are ignored. The router
// records its inner series with it; instruments a program adds with it are
// reported under the same scope as Spillway's.
func Meter(opts ...Option) metric.Meter {
	return meter(newConfig(opts).meterProvider)
}
