package redisbroker

import (
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
)

// Metadata set on a dead-lettered message. It keeps the rest of the
// malformed message's metadata, but not the malformed flag: read back from
// the dead-letter stream it is a well-formed message.
const (
	// metadataDeadLetterSource is the stream the malformed entry was read from.
	metadataDeadLetterSource = "spillway_deadletter_stream"
	// metadataDeadLetterID is the malformed entry's ID in that stream.
	metadataDeadLetterID = "spillway_deadletter_id"
	// metadataDeadLetterReason is why the entry could not be unmarshalled.
	metadataDeadLetterReason = "spillway_deadletter_reason"
)

// DeadLetter is a Watermill middleware that moves malformed messages (see
// [IsMalformed]), and messages whose entry Redis has delivered more than
// Config.MaxDeliveries times, to the dead-letter topic instead of running
// the handler: it publishes them, then the router acks the original. If
// publishing fails the message is nacked and retried, so such an entry is
// never dropped. Other messages pass through. It is safe for concurrent
// use.
//
// The copy is published with the message's context, so a tracing
// publisher continues the message's trace; an unreadable entry's
// message carries the producer's W3C trace context when its metadata
// field could still be read.
type DeadLetter struct {
	pub    message.Publisher
	topic  string
	logger watermill.LoggerAdapter
	count  atomic.Uint64
}

// NewDeadLetter returns the middleware that moves entries to
// cfg.DeadLetterTopic (default spillway.deadletter; the other fields of
// cfg are not used), publishing them with the publisher given with
// [WithPublisher], which is required. With [WithLogger] it logs each
// dead-lettered entry at Info.
func NewDeadLetter(cfg Config, opts ...Option) (*DeadLetter, error) {
	cfg.setDefaults()
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if o.publisher == nil {
		return nil, &spillway.FieldError{Field: "WithPublisher", Value: "nil",
			Reason: "required: give NewDeadLetter the publisher of the dead-letter topic"}
	}
	return &DeadLetter{pub: o.publisher, topic: cfg.DeadLetterTopic, logger: o.logger}, nil
}

// Count returns how many messages were moved to the dead-letter topic.
func (d *DeadLetter) Count() uint64 { return d.count.Load() }

// Middleware wraps h. Add it before (outside) the budget middleware: a
// malformed message has no vertex_count and would be charged the whole
// budget, and an exhausted one must not reach the handler at all.
func (d *DeadLetter) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if flagged(msg) {
			return nil, d.moveFlagged(msg)
		}
		return h(msg)
	}
}

// flagged reports whether msg must be moved to the dead-letter topic.
func flagged(msg *message.Message) bool { return IsMalformed(msg) || exhausted(msg) != "" }

// moveFlagged moves msg, which flagged reports, with the reason it has.
func (d *DeadLetter) moveFlagged(msg *message.Message) error {
	if IsMalformed(msg) {
		return d.move(msg, msg.Metadata.Get(metadataMalformedReason))
	}
	return d.move(msg, exhausted(msg))
}

// move publishes msg's entry to the dead-letter topic with reason.
func (d *DeadLetter) move(msg *message.Message, reason string) error {
	dl := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		dl.Metadata.Set(k, v)
	}
	entry, _ := entryOf(msg)
	for _, k := range reservedMetadata {
		delete(dl.Metadata, k)
	}
	dl.Metadata.Set(metadataDeadLetterReason, reason)
	dl.Metadata.Set(metadataDeadLetterSource, entry.Stream)
	dl.Metadata.Set(metadataDeadLetterID, entry.ID)
	dl.SetContext(msg.Context())
	if err := d.pub.Publish(d.topic, dl); err != nil {
		return fmt.Errorf("redisbroker: dead-lettering entry %s of %q: %w", entry.ID, entry.Stream, err)
	}
	d.count.Add(1)
	d.logger.Info("Entry moved to the dead-letter topic", watermill.LogFields{
		"stream": entry.Stream, "xid": entry.ID, "topic": d.topic, "reason": reason,
	})
	return nil
}
