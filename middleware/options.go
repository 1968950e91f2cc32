package middleware

import (
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
)

// Option configures what is optional in [NewVertexBudget] (WithLanes,
// WithMessageLimit) or in [New] (the other With… options). Each option
// belongs to one of them, as its comment says; passing it to the other is
// an error that names it.
type Option func(*options)

// options collects what the options set, for both constructors.
type options struct {
	// NewVertexBudget's.
	lanes        []Lane
	messageLimit int64

	// New's.
	admitterSettings

	// The names of the options given, by the constructor they belong
	// to, for the error a misplaced one gets.
	forBudget, forNew []string
}

// admitterSettings are what New's options set, kept by the [Admitter].
type admitterSettings struct {
	estimator       cost.ChargeEstimator
	onAdmission     func(*message.Message, Admission)
	onOversize      func(*message.Message, Admission) error
	revoked         func(*message.Message) <-chan struct{}
	maxPayloadBytes int
	maxVertices     int64
}

// collect applies opts.
func collect(opts []Option) *options {
	o := &options{}
	for _, opt := range opts {
		if opt != nil {
			opt(o)
		}
	}
	return o
}

// misplaced returns a [*spillway.FieldError] for each option in names,
// which belongs to the constructor other than the one called.
func misplaced(names []string, owner, called string) []error {
	var errs []error
	for _, n := range names {
		errs = append(errs, &spillway.FieldError{Field: "opts", Value: n,
			Reason: "is an option of " + owner + ", not of " + called + "; pass it there"})
	}
	return errs
}

// WithMessageLimit, an option of [NewVertexBudget], additionally bounds
// the number of admitted messages: at most n permits are outstanding at
// once, whatever their vertex cost. Use it for handlers with a fixed
// per-message price (a database round trip) on top of their geometry
// work. n <= 0 means no message limit.
func WithMessageLimit(n int64) Option {
	return func(o *options) {
		o.forBudget = append(o.forBudget, "WithMessageLimit")
		o.messageLimit = max(n, 0)
	}
}

// WithEstimator, an option of [New], sets how each message is priced.
// Default: cost.NewEstimator(cost.FullBudget), which reads vertex_count and
// charges the whole budget when it is missing or malformed.
func WithEstimator(e cost.ChargeEstimator) Option {
	return func(o *options) {
		o.forNew = append(o.forNew, "WithEstimator")
		o.estimator = e
	}
}

// WithOnAdmission, an option of [New], sets f to be called once per
// message after admission has been decided, whatever its
// [AdmissionResult], from the message's goroutine, before the handler
// runs. It must be fast and must not block.
func WithOnAdmission(f func(msg *message.Message, a Admission)) Option {
	return func(o *options) {
		o.forNew = append(o.forNew, "WithOnAdmission")
		o.onAdmission = f
	}
}

// WithRevoked, an option of [New], sets f to return a channel that is
// closed when msg's delivery has been revoked: its Kafka session ended in
// a rebalance, say. A message still waiting for budget when that happens
// steps aside at once ([Revoked]): the handler does not run and the
// message is acked, which watermill-kafka does not commit once the session
// is gone, so the partition's next owner processes it. Admitted work is
// never interrupted. A nil channel means the delivery cannot be revoked.
func WithRevoked(f func(msg *message.Message) <-chan struct{}) Option {
	return func(o *options) {
		o.forNew = append(o.forNew, "WithRevoked")
		o.revoked = f
	}
}

// WithMaxPayloadBytes, an option of [New], refuses a message whose
// payload is larger than n bytes, before it is priced ([Oversize]):
// decoding takes memory in proportion to the bytes, and a payload above
// what the memory bound can hold must not run at all. 0, the default,
// means no limit; a negative n is an error.
func WithMaxPayloadBytes(n int) Option {
	return func(o *options) {
		o.forNew = append(o.forNew, "WithMaxPayloadBytes")
		o.maxPayloadBytes = n
	}
}

// WithMaxVertices, an option of [New], refuses a message whose counted
// charge (a vertex_count header or a computed count, not the default
// charge of an unknown cost) is above n vertices ([Oversize]). Use the
// largest message that finishes alone within the redelivery deadline
// (package sizing computes it): one message runs on one core, so a bigger
// one would hold a rebalance or a claim however big the budget is. 0, the
// default, means no limit: a charge above the capacity is clamped and runs
// alone. A negative n is an error.
func WithMaxVertices(n int64) Option {
	return func(o *options) {
		o.forNew = append(o.forNew, "WithMaxVertices")
		o.maxVertices = n
	}
}

// WithOnOversize, an option of [New], sets f to take a message refused by
// [WithMaxPayloadBytes] or [WithMaxVertices] instead of the handler: it
// publishes it elsewhere (an oversize topic consumed with a longer
// deadline, a dead-letter topic) and returns nil, and the message is
// acked; an error it returns is returned instead, wrapping [ErrOversize].
// Without it the middleware returns an error wrapping ErrOversize, which a
// retry gate dead-letters. It runs on the message's goroutine and holds no
// budget.
func WithOnOversize(f func(msg *message.Message, a Admission) error) Option {
	return func(o *options) {
		o.forNew = append(o.forNew, "WithOnOversize")
		o.onOversize = f
	}
}

// checkLimits reports negative size limits.
func (o *options) checkLimits() []error {
	var errs []error
	if o.maxPayloadBytes < 0 {
		errs = append(errs, &spillway.FieldError{Field: "WithMaxPayloadBytes", Value: strconv.Itoa(o.maxPayloadBytes),
			Reason: "must not be negative (0: no limit)"})
	}
	if o.maxVertices < 0 {
		errs = append(errs, &spillway.FieldError{Field: "WithMaxVertices", Value: strconv.FormatInt(o.maxVertices, 10),
			Reason: "must not be negative (0: no limit)"})
	}
	return errs
}
