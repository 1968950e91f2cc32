package telemetry

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
)

// MetadataCarrier adapts a message's metadata to OpenTelemetry's
// propagation.TextMapCarrier, so a propagator can write trace context into
// a message (traceparent, tracestate with the W3C propagator) and read it
// back on the consuming side. Watermill's Kafka and Redis Streams
// marshallers carry metadata as headers and fields, so the context survives
// the broker.
//
// Keys are used as given: the W3C propagator writes lower-case keys, which
// every Watermill marshaller keeps. A MetadataCarrier is not safe for
// concurrent use, like the message it wraps.
type MetadataCarrier struct{ Msg *message.Message }

var _ propagation.TextMapCarrier = MetadataCarrier{}

// Get returns the metadata value of key, or "".
func (c MetadataCarrier) Get(key string) string {
	return c.Msg.Metadata.Get(key)
}

// Set stores value under key, creating the metadata map if needed.
func (c MetadataCarrier) Set(key, value string) {
	if c.Msg.Metadata == nil {
		c.Msg.Metadata = make(message.Metadata, 2)
	}
	c.Msg.Metadata.Set(key, value)
}

// Keys returns the metadata keys.
func (c MetadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c.Msg.Metadata))
	for k := range c.Msg.Metadata {
		keys = append(keys, k)
	}
	return keys
}
