package router

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/copyctx"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/retrygate"
)

// oversizeCause is the dead-letter cause of a message the budget refused
// as too large (budget.max_payload_bytes, budget.max_message_vertices).
const oversizeCause = "oversize"

// limitSize returns the admission's size limits and where refused messages go:
// budget.oversize_topic, else the dead-letter topic of retry.dead_letter_topic,
// published by the router itself whether the retry gate is on or not. Not
// through the gate: its copies go through the stamping publisher, which
// would count (or refuse) the very payload that was too big, and a custom
// IsPermanent need not treat the refusal as permanent.
func (r *Router) limitSize() []middleware.Option {
	opts := []middleware.Option{middleware.WithMaxVertices(r.cfg.Budget.MaxMessageVertices), middleware.WithOnOversize(r.routeOversize)}
	if n := r.cfg.Budget.MaxPayloadBytes; n > 0 {
		opts = append(opts, middleware.WithMaxPayloadBytes(int(n)))
	}
	r.oversizeLog.setEvery(oversizeLogEvery)
	return opts
}

// routeOversize publishes a copy of a refused message to
// budget.oversize_topic, or to the dead-letter topic of the topic it was
// consumed from, and lets the original be acked. The copy goes straight to
// the broker's publisher: it keeps the original's metadata (its
// vertex_count, its trace context) and is never priced again. A line is
// logged per topic at most every oversizeLogEvery (router/warnings.go).
func (r *Router) routeOversize(msg *message.Message, a middleware.Admission) error {
	origin := r.originTopic(msg)
	topic, deadLettered := r.cfg.Budget.OversizeTopic, false
	cp := msg.Copy()
	cp.SetContext(copyctx.Of(msg.Context())) // keeps the record's Kafka key
	if topic == "" {
		topic, deadLettered = r.cfg.Retry.DeadLetterTopicFor(origin), true
		cp.Metadata.Set(retrygate.DeadLetterCauseKey, oversizeCause)
		cp.Metadata.Set(retrygate.OriginTopicKey, origin)
	}
	if err := r.back.ensureTopic(topic); err != nil {
		return fmt.Errorf("router: oversize topic %q: %w", topic, err)
	}
	if err := r.back.publisher().Publish(topic, cp); err != nil {
		return fmt.Errorf("router: publishing oversize message to %q: %w", topic, err)
	}
	switch {
	case r.metrics == nil:
	case deadLettered:
		r.metrics.OnDeadLettered(msg, origin, oversizeCause)
	default:
		r.metrics.OnDeferred(msg, origin, oversizeCause)
	}
	r.warnOversize(msg, a, origin, topic)
	return nil
}
