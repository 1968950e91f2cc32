package telemetry

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
)

// metadataCarrier adapts a message's metadata to OpenTelemetry's
// propagation.TextMapCarrier, so a propagator can write trace context into
// a message (traceparent, tracestate with the W3C propagator) and read it
// back on the consuming side. Watermill's Kafka and Redis Streams
// marshallers carry metadata as headers and fields, so the context survives
// the broker.
//
// Keys are used as given: the W3C propagator writes lower-case keys, which
// every Watermill marshaller keeps. A metadataCarrier is not safe for
// concurrent use, like the message it wraps.
type metadataCarrier struct{ msg *message.Message }

var _ propagation.TextMapCarrier = metadataCarrier{}

// Get returns the metadata value of key, or "".
func (c metadataCarrier) Get(key string) string {
	return c.msg.Metadata.Get(key)
}

// Set stores value under key, creating the metadata map if needed.
func (c metadataCarrier) Set(key, value string) {
	if c.msg.Metadata == nil {
		c.msg.Metadata = make(message.Metadata, 2)
	}
	c.msg.Metadata.Set(key, value)
}

// Keys returns the metadata keys.
func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c.msg.Metadata))
	for k := range c.msg.Metadata {
		keys = append(keys, k)
	}
	return keys
}
