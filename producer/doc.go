// Package producer holds the producer-side pieces of work-aware
// backpressure: message.Publisher decorators that slow publishing down by
// the work it carries, so that a consumer group is not handed more
// vertices than it can drain.
//
// [RateLimited] limits publishing to a rate in vertices per second, with a
// burst (a token bucket, golang.org/x/time/rate). Each message is charged
// its vertex_count, so a publisher of large polygons slows down sooner
// than one of points. [LagThrottled] waits before each publish while the
// consumers' total lag, read from a cache kept fresh in the background
// (telemetry.LagSampler), is above a
// threshold, in proportion to how far above it is: it closes the loop from
// a consumer group back to its producers.
//
// Both read counts stamped into the metadata, so put a stamping publisher
// outside them. Producer chain, outermost first:
//
//	telemetry.NewTracingPublisher(cost.NewStampingPublisher(
//		lagThrottled(rateLimited(broker))))
//
// Configure them with [RateLimitConfig] and [LagThrottleConfig]: zero
// fields take their defaults, [RateLimitConfig.Validate] and
// [LagThrottleConfig.Validate] report every bad value as a [*spillway.FieldError]
// (which matches [spillway.ErrInvalidConfig]), and [NewRateLimited] and
// [NewLagThrottled] return those errors instead of panicking. The router
// builds both from its producer section (router.Config.Producer) around
// router.Router.Publisher; the consumer side, admission against a vertex
// budget, is package middleware. Both count in a [Stats] how they held
// publishing back.
package producer
