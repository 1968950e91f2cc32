package router

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/spillway-go/spillway/telemetry"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkChain runs the router's middleware stack (memory broker,
// defaults) over a no-op handler, each message on a goroutine of its own as
// Watermill runs it: tracer=sdk samples every span, tracer=noop is
// OpenTelemetry's no-op tracer, telemetry=disabled has no tracing or
// metrics layer.
func BenchmarkChain(b *testing.B) {
	for _, c := range []struct {
		name     string
		tp       trace.TracerProvider
		disabled bool
		retry    bool
	}{
		{"tracer=sdk", sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(tracetest.NewNoopExporter()))), false, false},
		{"tracer=noop", tracenoop.NewTracerProvider(), false, false},
		{"telemetry=disabled", nil, true, false},
		{"telemetry=disabled/retry=on", nil, true, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := Config{Broker: brokerMemory}
			cfg.Telemetry.Disabled = c.disabled
			cfg.Retry.Disabled = !c.retry
			var opts []Option
			if c.tp != nil {
				opts = append(opts, WithTelemetry(telemetry.WithTracerProvider(c.tp)))
			}
			r, err := New(cfg, nil, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = r.Close() }()
			h := r.chain(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			ctx := context.Background()
			done := make(chan struct{})
			b.ReportAllocs()
			for b.Loop() {
				msg := message.NewMessage("m", nil)
				msg.Metadata.Set("vertex_count", "1")
				msg.SetContext(ctx)
				go func() {
					_, _ = h(msg)
					msg.Ack()
					done <- struct{}{}
				}()
				<-done
			}
		})
	}
}

// BenchmarkSettled is the settling layer's check of one message it keeps
// (settleEntry.settled), made for every kept message as the layer prunes:
// pending (neither acked nor nacked), acked and nacked.
func BenchmarkSettled(b *testing.B) {
	for _, c := range []struct {
		name   string
		settle func(*message.Message)
	}{
		{"pending", func(*message.Message) {}},
		{"acked", func(m *message.Message) { m.Ack() }},
		{"nacked", func(m *message.Message) { m.Nack() }},
	} {
		b.Run(c.name, func(b *testing.B) {
			msg := message.NewMessage("m", nil)
			c.settle(msg)
			e := settleEntry{acked: msg.Acked(), nacked: msg.Nacked()}
			want := c.name != "pending"
			b.ReportAllocs()
			for b.Loop() {
				if e.settled() != want {
					b.Fatal("wrong answer")
				}
			}
		})
	}
}
