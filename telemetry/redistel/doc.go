// Package redistel connects Spillway's telemetry to Redis Streams: a
// [telemetry.LagSource] over a redisbroker.Subscriber, for the shared
// telemetry.LagSampler (lag metrics, the shedding pressure signal and
// producer throttling).
//
// It is a separate package so that redisbroker does not depend on the
// telemetry package, the way telemetry/kafkatel keeps Sarama out of it.
package redistel
