package router

import (
	"strings"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/telemetry"
)

// reservedPrefix starts every metadata key Spillway's stages write and
// trust (the retry gate's spillway_attempt and spillway_origin_topic, the
// shedding audit's keys, Redis dead-letter keys).
const reservedPrefix = "spillway_"

// buildPublishers builds the router's three publishers over the broker's,
// each behind tracing when telemetry is on (topts):
//
//   - pub, for the application ([Router.Publisher] without a producer
//     section): stamps each message's vertex_count, and refuses a payload
//     it cannot count, so the caller learns of it at once.
//   - copies, for what the router republishes on a delivery's behalf
//     (retry and dead-letter copies, shedding audits, Redis dead letters):
//     published as they are, never counted again. A copy keeps the charge
//     its original was stamped with, or none; re-stamping would refuse an
//     uncountable payload, which then could never be dead-lettered.
//   - outputs, for the messages a handler returns: stripped of every
//     spillway_* key (a handler that copies its input must not pass on the
//     retry gate's bookkeeping, which would send the output's retries to
//     another topic), then stamped, except that a payload that cannot be
//     counted is published unstamped rather than refused: refusing would
//     nack the input, which would fail the same way forever.
//
// Only pub closes the broker's publisher.
func (r *Router) buildPublishers(topts []telemetry.Option) {
	broker := r.back.publisher()
	r.pub = cost.NewStampingPublisher(broker)
	r.copies = nopClosePublisher{broker}
	r.outputs = strippingPublisher{cost.NewStampingPublisher(nopClosePublisher{broker}, cost.WithSkipUncountable())}
	if topts != nil {
		r.pub = telemetry.NewTracingPublisher(r.pub, topts...)
		r.copies = telemetry.NewTracingPublisher(r.copies, topts...)
		r.outputs = telemetry.NewTracingPublisher(r.outputs, topts...)
	}
	r.back.useCopies(r.copies)
}

// strippingPublisher deletes every spillway_* metadata key of the messages
// it publishes.
type strippingPublisher struct{ message.Publisher }

func (p strippingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m == nil {
			continue
		}
		for k := range m.Metadata {
			if strings.HasPrefix(k, reservedPrefix) {
				delete(m.Metadata, k)
			}
		}
	}
	return p.Publisher.Publish(topic, msgs...)
}

// latePublisher forwards to a publisher set after it was handed out: the
// Redis dead-letter layer is built with the backend, before the router's
// publishers exist. It never closes what it forwards to.
type latePublisher struct {
	p atomic.Pointer[message.Publisher]
}

func (l *latePublisher) set(p message.Publisher) { l.p.Store(&p) }

func (l *latePublisher) Publish(topic string, msgs ...*message.Message) error {
	return (*l.p.Load()).Publish(topic, msgs...)
}

func (l *latePublisher) Close() error { return nil }
