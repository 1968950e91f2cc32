package telemetry

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
)

// Internals for the external tests.
var (
	ScopeVersion   = scopeVersion
	ModuleVersion  = moduleVersion
	WithLagTimeout = withLagTimeout
	WithLagMaxAge  = withLagMaxAge
)

// NewMetadataCarrier returns the carrier the tracing middlewares use.
func NewMetadataCarrier(msg *message.Message) propagation.TextMapCarrier {
	return metadataCarrier{msg}
}

// Count exposes count to the external tests.
func (m *Metrics) Count(ctx context.Context, o, topic, reason string, n int64) {
	m.count(ctx, outcome(o), topic, reason, n)
}

// Run exposes run to the external tests.
func (s *LagSampler) Run(ctx context.Context) error { return s.run(ctx) }

// Samples exposes latest to the external tests.
func (s *LagSampler) Samples() []LagSample { return s.latest() }

// Stats exposes stats to the external tests.
func (s *LagSampler) Stats() lagStats { return s.stats() }
