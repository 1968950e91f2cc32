// Package kafkabroker is Spillway's Kafka side: the hook through which an
// in-process broker is linked in on request ([RegisterEmbedded]), so the
// library itself never links a fake broker.
//
// A program or test that wants kafka.brokers "embedded" imports
// github.com/spillway-go/spillway/embedded for its side effects; without
// that import, "embedded" is a configuration error that names the import.
package kafkabroker
