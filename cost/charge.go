package cost

import (
	"math"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// MetadataKey is the message metadata key that carries a message's cost in
// vertices, as a base-10 integer.
const MetadataKey = "vertex_count"

// FullBudget is a charge larger than any budget. A vertex budget clamps it to
// its capacity at admission, so a message charged FullBudget runs alone. It is
// the default charge for a message whose cost is unknown.
const FullBudget int64 = math.MaxInt64

// Source says where the vertex count of a [Charge] came from. The zero
// value is SourceHeader, so a charge an estimator of your own returns
// without a Source counts as read from the metadata.
type Source uint8

const (
	// SourceHeader: the count was read from the message's metadata.
	SourceHeader Source = iota
	// SourceMissing: the metadata had no count; the default was charged.
	SourceMissing
	// SourceMalformed: the metadata held a count that could not be trusted
	// (not an integer, negative, overflowing, or zero for a non-empty
	// payload); the default was charged.
	SourceMalformed
	// SourceComputed: the metadata had no usable count and the estimator
	// counted the vertices of the payload itself.
	SourceComputed
)

var sourceNames = [...]string{
	SourceHeader:    "header",
	SourceMissing:   "missing",
	SourceMalformed: "malformed",
	SourceComputed:  "computed",
}

// String returns "header", "missing", "malformed" or "computed": the source
// label of the spillway.admission.charges metric and the
// spillway.cost.source span attribute.
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// Charge is what admitting one message costs.
//
// Vertices is the work dimension. Messages is the per-message dimension, for
// handlers whose cost is dominated by a fixed per-message price such as a
// database round trip; a budget with a message limit bounds both. The
// estimator of [NewEstimator] charges one message; an estimator of your own
// may charge more.
type Charge struct {
	// Vertices is the message's work: its vertex count.
	Vertices int64
	// Messages is how many messages it counts as against a budget's
	// message limit: 1 for the estimator of [NewEstimator].
	Messages int64
	// Source says where Vertices came from: the header, a count computed
	// from the payload, or the default for a missing or malformed one.
	Source Source
}

// ChargeEstimator prices a message: what the middleware's admission and the
// sizing package's auto-sizer take. [NewEstimator] returns the one that
// reads the count stamped in the metadata; supply your own to price
// messages another way. Implementations must be safe for
// concurrent use.
type ChargeEstimator interface {
	// Estimate returns what admitting msg costs. It must not fail: a
	// message it cannot price gets a charge that says so in its Source.
	Estimate(msg *message.Message) Charge
}

// estimator is the [ChargeEstimator] [NewEstimator] returns.
type estimator struct {
	defaultCost int64
	options
}

// options are what an [Option] sets. Each constructor reads the ones that
// concern it.
type options struct {
	computeMissing  bool // NewEstimator
	skipUncountable bool // NewStampingPublisher
}

// Option configures [NewEstimator] or [NewStampingPublisher]. Each option
// says which of them it is for; the other ignores it.
type Option func(*options)

func newOptions(opts []Option) options {
	var o options
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o
}

// WithComputeMissing makes the estimator count the payload's vertices when the
// metadata has no usable count (missing or malformed), with the rule
// [NewStampingPublisher] stamps by: [CountPayload], but at least 1 for a
// non-empty payload and 0 for an empty one. A payload that cannot be decoded
// is still charged the default. Counting costs a full parse (for GeoJSON), so
// prefer stamping at ingest. For [NewEstimator].
func WithComputeMissing() Option {
	return func(o *options) { o.computeMissing = true }
}

// NewEstimator returns an estimator that turns a message into a [Charge]
// without parsing its geometry in the common case: it reads the count
// stamped under [MetadataKey], and charges defaultCost vertices for a
// message whose count is missing or malformed. Whatever the count, a
// message is charged at least one vertex per 64 bytes of payload: decoding
// takes memory in proportion to the bytes, so a payload far bigger than its
// count says (a forged vertex_count, a geometry of empty members, huge
// properties) is charged for its size. Real geometry takes fewer bytes per
// vertex than that and is charged its count. It is immutable and safe for
// concurrent use. The default should be high:
// pass [FullBudget] (or the budget's capacity) so an unstamped message is
// treated as the most expensive one, never the cheapest. A non-positive
// defaultCost is replaced by FullBudget.
func NewEstimator(defaultCost int64, opts ...Option) ChargeEstimator {
	if defaultCost <= 0 {
		defaultCost = FullBudget
	}
	return &estimator{defaultCost: defaultCost, options: newOptions(opts)}
}

// Estimate returns the charge for msg.
func (e *estimator) Estimate(msg *message.Message) Charge {
	n, src := ParseCount(msg.Metadata.Get(MetadataKey), len(msg.Payload))
	if src != SourceHeader {
		n, src = e.unstamped(msg, src)
	}
	// Decoding takes memory in proportion to the payload's bytes, whatever
	// the count says: never charge less than the size floor.
	n = max(n, sizeFloor(len(msg.Payload)))
	return Charge{Vertices: n, Messages: 1, Source: src}
}

// unstamped returns the count and source of msg, whose count (of source
// src) cannot be trusted: computed from its payload if the estimator
// computes missing counts and the payload parses, the default cost
// otherwise.
func (e *estimator) unstamped(msg *message.Message, src Source) (int64, Source) {
	if e.computeMissing {
		// Same rule as the stamping publisher, so a computed charge equals
		// the one a stamped message would get.
		if v, err := payloadCharge(msg.Payload); err == nil {
			return v, SourceComputed
		}
	}
	return e.defaultCost, src
}

// ParseCount parses a vertex_count metadata value for a payload of
// payloadLen bytes. It returns the count and SourceHeader when the value can
// be trusted, and (0, SourceMissing) or (0, SourceMalformed) otherwise. A
// value is malformed when it is not a plain base-10 integer (signs other than
// a leading '+', spaces, fractions and exponents are rejected), when it is
// negative or overflows int64, or when it is zero although the payload is not
// empty.
func ParseCount(value string, payloadLen int) (int64, Source) {
	if value == "" {
		return 0, SourceMissing
	}
	if value[0] == '+' {
		value = value[1:]
	}
	// No length shortcut: leading zeros are legal, and the overflow check
	// below stops at the first digit too many.
	if value == "" {
		return 0, SourceMalformed
	}
	var n int64
	for i := 0; i < len(value); i++ {
		c := value[i]
		if c < '0' || c > '9' {
			return 0, SourceMalformed
		}
		d := int64(c - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, SourceMalformed
		}
		n = n*10 + d
	}
	if n == 0 && payloadLen > 0 {
		return 0, SourceMalformed
	}
	return n, SourceHeader
}
