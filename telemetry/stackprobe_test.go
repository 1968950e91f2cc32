//go:build stackprobe

package telemetry_test

import (
	"testing"

	"go.opentelemetry.io/otel/metric"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/spillway-go/spillway/internal/stackprobe"
)

// BenchmarkStackHighWater measures how deep the stacks of BenchmarkStack,
// composed by hand on a plain Watermill router, reach into the message
// goroutine's stack with internal/stackroom's growth switched off (the
// stackprobe build tag). It reports the median and deepest depth over b.N
// messages and stackprobe.Room:
//
//	go test -tags stackprobe -run '^$' -bench StackHighWater -benchtime 2000x ./telemetry/
func BenchmarkStackHighWater(b *testing.B) {
	sdkTP, sdkMP := sdkProviders()
	noopTP := func() trace.TracerProvider { return nooptrace.NewTracerProvider() }
	noopMP := func() metric.MeterProvider { return noopmetric.NewMeterProvider() }
	for _, s := range []benchStack{
		{name: "bare"},
		{name: "budget", budget: true},
		{name: "budget+otel-noop", budget: true, telemetry: true, tp: noopTP, mp: noopMP},
		{name: "budget+otel-noop-tracer+sdk-meter", budget: true, telemetry: true, tp: noopTP, mp: sdkMP},
		{name: "budget+otel-sdk", budget: true, telemetry: true, tp: sdkTP, mp: sdkMP},
	} {
		b.Run("stack="+s.name, func(b *testing.B) {
			probe := new(stackprobe.Probe)
			s.outer = probe.Middleware
			runStack(b, s, false)
			probe.Report(b)
		})
	}
}
