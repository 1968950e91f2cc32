package telemetry

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
)

// Internals for the external tests.
var (
	ScopeVersion  = scopeVersion
	ModuleVersion = moduleVersion
)

// NewMetadataCarrier returns the carrier the tracing middlewares use.
func NewMetadataCarrier(msg *message.Message) propagation.TextMapCarrier {
	return metadataCarrier{msg}
}

// Count is count.
func (m *Metrics) Count(ctx context.Context, outcome Outcome, topic, reason string, n int64) {
	m.count(ctx, outcome, topic, reason, n)
}

// Run is run.
func (s *LagSampler) Run(ctx context.Context) error { return s.run(ctx) }

// Samples is latest.
func (s *LagSampler) Samples() []LagSample { return s.latest() }

// Stats is stats.
func (s *LagSampler) Stats() lagStats { return s.stats() }
