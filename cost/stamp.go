package cost

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrUnstampable is returned (wrapped, together with the decode error) by
// the publisher of [NewStampingPublisher] when a message's payload cannot be counted.
var ErrUnstampable = errors.New("cost: message cannot be stamped")

// stampingPublisher is the publisher [NewStampingPublisher] returns.
type stampingPublisher struct {
	pub message.Publisher
	options
}

// WithSkipUncountable makes the stamping publisher publish a message whose
// payload it cannot count as it is, unstamped (or with the count it
// already carries), instead of refusing the whole call with
// [ErrUnstampable]. Use it where refusing is worse than an unknown cost:
// for the output of a consumer's handler, which would otherwise be
// redelivered and fail again forever. Downstream, such a message is charged
// as one with a missing count ([NewEstimator]'s default). For
// [NewStampingPublisher].
func WithSkipUncountable() Option {
	return func(o *options) { o.skipUncountable = true }
}

// NewStampingPublisher wraps pub in a [message.Publisher] decorator that
// stamps each message's vertex count into its metadata at ingest, so
// consumers can be charged without parsing geometry. By default a message
// that already has a count [ParseCount] accepts is left alone, and one whose
// count is missing or malformed is counted and stamped. It panics if pub is
// nil.
//
// Publish is all-or-nothing with respect to stamping: it counts every message
// of the call before touching any of them, and if one payload cannot be
// counted it returns an error wrapping [ErrUnstampable], leaves every
// message's metadata as it was and publishes nothing (with
// [WithSkipUncountable], that message is published unstamped instead). Once all counts are
// known it stamps the messages and hands them to the wrapped publisher in one
// call; if that call fails, the messages stay stamped.
//
// The count stamped is [CountPayload] of the payload, except that an empty
// payload is stamped "0" and a non-empty payload whose geometry has no
// vertices (an empty collection, a Feature with a null geometry) is stamped
// "1": [ParseCount] distrusts a zero count for a non-empty payload, so
// stamping 0 would make the message cost the full budget downstream. A
// GeoJSON geometry is stamped at least the number of its coordinate arrays
// (polygons, rings, lines): a MultiPolygon of a million empty polygons has
// no vertex, but decoding it builds a million polygons. Real geometry has
// more vertices than arrays and is stamped its count.
//
// The publisher is immutable after construction and safe for concurrent
// use if the wrapped publisher is. Publish writes to the metadata of the
// messages it is given, so the same message must not be published from two
// goroutines at once (watermill requires that anyway).
func NewStampingPublisher(pub message.Publisher, opts ...Option) message.Publisher {
	if pub == nil {
		panic("cost: NewStampingPublisher: nil publisher")
	}
	return &stampingPublisher{pub: pub, options: newOptions(opts)}
}

// Publish stamps messages that need it and publishes them all to topic with
// the wrapped publisher. See [NewStampingPublisher] for the all-or-nothing
// contract and the values stamped.
func (p *stampingPublisher) Publish(topic string, messages ...*message.Message) error {
	// First pass: count everything, mutate nothing. stamps[i] == "" means
	// message i keeps its metadata.
	var stamps []string
	for i, msg := range messages {
		if msg == nil {
			return fmt.Errorf("%w: message %d of %d is nil", ErrUnstampable, i, len(messages))
		}
		if _, src := ParseCount(msg.Metadata.Get(MetadataKey), len(msg.Payload)); src == SourceHeader {
			continue
		}
		n, err := payloadCharge(msg.Payload)
		if err != nil && p.skipUncountable {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: message %d of %d (uuid %q): %w", ErrUnstampable, i, len(messages), msg.UUID, err)
		}
		if stamps == nil {
			stamps = make([]string, len(messages))
		}
		stamps[i] = strconv.FormatInt(n, 10)
	}
	// Second pass: every count is known; stamp.
	for i, s := range stamps {
		if s == "" {
			continue
		}
		msg := messages[i]
		if msg.Metadata == nil {
			msg.Metadata = make(message.Metadata, 1)
		}
		msg.Metadata.Set(MetadataKey, s)
	}
	return p.pub.Publish(topic, messages...)
}

// Close closes the wrapped publisher.
func (p *stampingPublisher) Close() error {
	return p.pub.Close()
}
