// Package telemetry makes Spillway's backpressure visible: OpenTelemetry
// traces that follow a message from its producer through Kafka, Redis
// Streams or memory to its consumer, and metrics for every signal the
// middlewares act on.
//
// # Tracing
//
// [NewTracingPublisher] wraps a Watermill publisher: it starts a producer span
// per message and writes the span's context into the message metadata with
// the configured propagator (W3C traceparent and tracestate with
// propagation.TraceContext). [NewTracing], the outermost middleware
// of the consumer's stack, reads it back and starts the consumer span as
// its child, so one trace shows the send, the wait for budget and the
// processing ([WithLinkToProducer] links it to the producer's span in a
// trace of its own instead, for producers you do not trust). The span sits
// in the message's context (trace.SpanFromContext(msg.Context())), where
// the Spillway stages annotate it through the hooks of [Metrics]:
// [Metrics.OnAdmission] as middleware.WithOnAdmission,
// [Metrics.OnShed] as shedding's hook, [Metrics.OnRetryOutcome] as the
// retry gate's (counters only), and [Metrics.OnDeferred] and
// [Metrics.OnDeadLettered] from stages of your own. The router calls them
// for its own stages.
//
// # Metrics
//
// [Metrics] records with the OpenTelemetry metric API. Per-message
// instruments (duration, vertices, outcomes, admission wait, charges by
// source) are fed by [Metrics.Middleware] and the hooks; state is read by
// observable instruments once per collection: [Metrics.ObserveBudget] for a
// middleware.VertexBudget, [Metrics.ObserveBounds] for auto-sizing and
// [Metrics.ObserveLag] for consumer lag. docs/operations.md lists every
// metric with its Prometheus name, the recommended alerts and a dashboard.
//
// # Lag
//
// A [LagSampler] polls a [LagSource] (Kafka partitions with
// telemetry/kafkatel, Redis stream groups with telemetry/redistel, or a
// function of your own) in one
// background goroutine and caches the result. Readers —
// metrics, the shedding pressure signal ([LagSampler.SaturatedFor]) and
// lag-aware producers (producer.NewLagThrottled with
// [LagSampler.TotalLag]) — never reach the broker.
//
// # Defaults and failure
//
// Every constructor takes the package's [Option]s. Providers and the
// propagator ([WithTracerProvider], [WithMeterProvider], [WithPropagator])
// default to OpenTelemetry's globals, which export and propagate nothing
// until the application installs real ones; the router takes the same
// options for the telemetry it wires.
// Telemetry never fails or delays a message beyond its own bookkeeping: no
// middleware or publisher here returns an error of its own, exporters run
// outside the message path, and a panic in a handler is recorded and
// re-raised unchanged.
//
// # Wiring
//
// Consumer stack, outermost first:
//
//	router.AddMiddleware(tracing, metrics.Middleware, /* shedding, retry gate, */ admission.Middleware)
//
// with admission from middleware.New(budget, middleware.WithOnAdmission(metrics.OnAdmission)).
// Producer chain, outermost first: the publisher of [NewTracingPublisher] over a
// cost.NewStampingPublisher over a producer.LagThrottled (reading the
// sampler) over a producer.RateLimited over the broker's publisher.
package telemetry
