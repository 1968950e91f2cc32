// Package spillway holds the vocabulary the Spillway packages share: the
// error every Validate returns ([FieldError], matched by
// [ErrInvalidConfig]), the value that switches a setting off ([Off]), and
// the saturation signal that shedding and the retry gate read
// ([Pressure]).
//
// Spillway gives spatial message streams work-aware backpressure in
// Watermill: each message carries its cost in vertices (package cost), a
// consumer admits work against a FIFO vertex budget (package middleware)
// sized from measurements, sheds and retries under pressure (packages
// shedding and retrygate), and runs the whole stack on Kafka or Redis
// Streams from one configuration (packages router, kafkabroker,
// redisbroker), visible in OpenTelemetry (package telemetry). Start at
// docs/index.md.
package spillway
