// Package kafkatel connects Spillway's telemetry to Kafka: span attributes
// from watermill-kafka's message context, and a [telemetry.LagSource] that
// reads consumer lag through Sarama.
//
// It is a separate package so that programs on Redis Streams or in memory
// do not link Sarama through the telemetry package.
package kafkatel
