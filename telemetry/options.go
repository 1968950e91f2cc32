package telemetry

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every tracer and meter this
// package creates. The scope also carries the library module's version
// (from the binary's build information; "(devel)" in a working tree) and
// the schema URL of the semantic conventions the attributes follow.
const ScopeName = "github.com/spillway-go/spillway/telemetry"

// attemptKey is the metadata key the retry attempt is read from: the key
// Spillway's retry gate writes (a base-10 integer).
const attemptKey = "spillway_attempt"

// Option configures the constructors of this package: [NewTracing],
// [NewTracingPublisher], [NewMetrics] and [NewLagSampler]. Each option
// says which of them read it; the others ignore it, so one list can serve
// them all. The router takes the same options for the telemetry it wires
// (the providers and the propagator; it sets the others from its
// configuration).
type Option func(*config)

type config struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	propagator     propagation.TextMapPropagator
	system         string
	consumerGroup  string
	attributes     func(*message.Message) []attribute.KeyValue
	topic          func(*message.Message) string
	producerSpans  bool
	linkProducer   bool

	// NewLagSampler's.
	lagInterval     time.Duration
	lagTimeout      time.Duration
	lagMaxAge       time.Duration
	lagThreshold    int64
	hasLagThreshold bool
}

func newConfig(opts []Option) config {
	c := config{
		system:        "watermill",
		producerSpans: true,
		lagInterval:   defaultLagInterval,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	// Resolved at construction, as OpenTelemetry instrumentation does: the
	// globals delegate to whatever provider the application installs later.
	if c.tracerProvider == nil {
		c.tracerProvider = otel.GetTracerProvider()
	}
	if c.meterProvider == nil {
		c.meterProvider = otel.GetMeterProvider()
	}
	if c.propagator == nil {
		c.propagator = otel.GetTextMapPropagator()
	}
	return c
}

// WithTracerProvider sets the provider spans are created with, for
// [NewTracing] and [NewTracingPublisher]. Default (and when tp is nil): the global provider, otel.GetTracerProvider(), which
// exports nothing until the application installs one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider = tp }
}

// WithMeterProvider sets the provider instruments are created with, for
// [NewMetrics]. Default (and when mp is nil): the global provider, otel.GetMeterProvider(), which
// records nothing until the application installs one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider = mp }
}

// WithPropagator sets how trace context is written to and read from message
// metadata, for [NewTracing] and [NewTracingPublisher]. Default (and when p is nil): the global propagator,
// otel.GetTextMapPropagator(). OpenTelemetry's global propagator propagates
// nothing until the application sets one; to carry W3C traceparent and
// tracestate, set propagation.TraceContext{} (globally or here).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.propagator = p }
}

// WithMessagingSystem sets the messaging.system attribute of the spans of
// [NewTracing] and [NewTracingPublisher]:
// "kafka" (the value OpenTelemetry's semantic conventions define), or the
// values Spillway uses where the conventions define none, "redis" for
// Redis Streams and "gochannel" for Watermill's in-memory GoChannel.
// Default "watermill".
func WithMessagingSystem(system string) Option {
	return func(c *config) {
		if system != "" {
			c.system = system
		}
	}
}

// WithConsumerGroup sets the messaging.consumer.group.name attribute of the
// consumer spans of [NewTracing]: the Kafka consumer group or the Redis
// Streams group.
func WithConsumerGroup(group string) Option {
	return func(c *config) { c.consumerGroup = group }
}

// WithAttributes adds attributes computed from each message to its consumer
// span (computed as the span starts, set with its outcome as it ends, in
// one call) and to its producer span. Use it for
// broker-specific attributes such as a Kafka partition, offset and key; the
// kafkatel subpackage provides that function for watermill-kafka. f is
// called from the message's goroutine and must be safe for concurrent use.
func WithAttributes(f func(msg *message.Message) []attribute.KeyValue) Option {
	return func(c *config) { c.attributes = f }
}

// WithTopicFunc sets how [NewTracing] and [NewMetrics] find the topic a
// message was consumed from. Default: message.SubscribeTopicFromCtx, which
// Watermill's router fills in.
func WithTopicFunc(f func(msg *message.Message) string) Option {
	return func(c *config) { c.topic = f }
}

// WithProducerSpans sets whether [NewTracingPublisher] starts a producer span
// per message (default true). Without one it injects the message context's
// current span, so the consumer span becomes a child of whatever span was
// active when the message was created.
func WithProducerSpans(enabled bool) Option {
	return func(c *config) { c.producerSpans = enabled }
}

// WithLinkToProducer sets whether [NewTracing] links the consumer span to
// the trace context a message carries instead of continuing that trace
// (default false: the producer's span is the consumer span's parent). With
// it, each delivery starts a trace of its own, and the producer's span is
// reachable through a span link: use it for producers outside your trust
// boundary, whose traceparent would otherwise join their traces to yours,
// and with a parent-based sampler decide what you sample. Baggage from the
// message is ignored too.
func WithLinkToProducer(enabled bool) Option {
	return func(c *config) { c.linkProducer = enabled }
}

// WithLagInterval sets how often the sampler of [NewLagSampler] samples.
// Default 10s; non-positive values are ignored.
func WithLagInterval(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.lagInterval = d
		}
	}
}

// WithLagThreshold sets the total lag above which the sampler of
// [NewLagSampler] reports pressure ([LagSampler.SaturatedFor]). Without it
// the sampler never reports pressure. A threshold of 0 means any lag at
// all; negative values are ignored.
func WithLagThreshold(n int64) Option {
	return func(c *config) {
		if n >= 0 {
			c.lagThreshold, c.hasLagThreshold = n, true
		}
	}
}

// withLagTimeout bounds each call to the lag source. Default: the
// interval. The tests set it.
func withLagTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.lagTimeout = d
		}
	}
}

// withLagMaxAge sets how old the latest successful lag sample may get
// before the sampler forgets it (see [LagSampler]). Default: three
// intervals. The tests set it.
func withLagMaxAge(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.lagMaxAge = d
		}
	}
}

func (c *config) topicOf(msg *message.Message) string {
	if c.topic != nil {
		return c.topic(msg)
	}
	return message.SubscribeTopicFromCtx(msg.Context())
}
