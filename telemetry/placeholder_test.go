package telemetry_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-go/spillway/telemetry"
)

// envPlaceholderChild runs TestGlobalPlaceholder's second half in a child
// process: it installs a global tracer provider, which must not leak into
// the other tests of this binary.
const envPlaceholderChild = "SPILLWAY_TEST_PLACEHOLDER_CHILD"

const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// With OpenTelemetry's global provider and nothing installed, the tracing
// middleware records no span but leaves the producer's span context in the
// message's context, for the handler and for propagation, and the metrics
// middleware measures nothing. Once the application installs providers,
// the same middlewares record spans and measurements.
func TestGlobalPlaceholder(t *testing.T) {
	if os.Getenv(envPlaceholderChild) == "1" {
		placeholderAfterInstall(t)
		return
	}
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
		t.Skip("a global provider is installed")
	}
	mw := telemetry.NewTracing(telemetry.WithPropagator(propagation.TraceContext{}))
	metrics, err := telemetry.NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	var seen trace.SpanContext
	h := mw(metrics.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		seen = trace.SpanContextFromContext(msg.Context())
		return nil, nil
	}))
	msg := message.NewMessage("1", nil)
	msg.Metadata.Set("traceparent", traceparent)
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	if seen.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || !seen.IsRemote() {
		t.Fatalf("handler saw span context %v, want the producer's", seen)
	}
	runInOwnProcess(t, "TestGlobalPlaceholder", envPlaceholderChild)
}

// runInOwnProcess runs the test named name again, alone, in a process of
// its own with env set to "1" (the test's process-wide part reads it), and
// fails t unless that run passed: a global OpenTelemetry provider or
// propagator installed there cannot leak into the other tests.
func runInOwnProcess(t *testing.T, name, env string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatalf("%s in a process of its own: %v\n%s", name, err, out)
	}
}

func placeholderAfterInstall(t *testing.T) {
	mw := telemetry.NewTracing(telemetry.WithPropagator(propagation.TraceContext{}))
	metrics, err := telemetry.NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	h := mw(metrics.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil }))
	run := func() {
		msg := message.NewMessage("1", nil)
		msg.Metadata.Set("traceparent", traceparent)
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
	}
	run() // nothing installed yet: no span, no measurement
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	mp, reader := newMeterProvider()
	otel.SetMeterProvider(mp)
	run()
	if n := mustPoint(t, collect(t, reader), "spillway.processed.messages", map[string]string{"topic": "", "outcome": "handled"}); n != 1 {
		t.Fatalf("%v messages counted after the meter provider was installed, want 1", n)
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans ended after the provider was installed, want 1", len(spans))
	}
	if got := spans[0].Parent().TraceID().String(); got != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("span's parent trace %s, want the producer's", got)
	}
}
