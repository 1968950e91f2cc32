package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
)

// AdmissionResult is how a message left admission: the handler ran, or
// why it did not. Its value is the name logs, span attributes and metric
// labels use.
type AdmissionResult string

const (
	// Admitted: the charge was granted and the handler ran.
	Admitted AdmissionResult = "admitted"
	// Cancelled: the message context ended while waiting; the handler did
	// not run and the message is nacked.
	Cancelled AdmissionResult = "cancelled"
	// Revoked: the message's delivery was revoked while it waited (its
	// Kafka session ended; see [WithRevoked]); the handler did not run and
	// the message is acked without effect, so the partition's next owner
	// processes it.
	Revoked AdmissionResult = "revoked"
	// Invalid: the charge could not be admitted at all (a negative cost
	// from a custom estimator); the message is nacked.
	Invalid AdmissionResult = "invalid"
	// Oversize: the payload is above [WithMaxPayloadBytes] or the charge
	// above [WithMaxVertices]; the handler did not run and the message
	// went to [WithOnOversize]'s function, or failed with [ErrOversize].
	Oversize AdmissionResult = "oversize"
)

// ErrOversize is wrapped by the error the middleware returns for a message
// it refuses as too large ([Oversize]) when no [WithOnOversize] function
// takes it. It wraps [cost.ErrTooLarge], so the retry gate's default
// classifier (retrygate.IsPermanent) dead-letters the message at once
// instead of retrying it.
var ErrOversize = fmt.Errorf("spillway: message too large to admit: %w", cost.ErrTooLarge)

// Admission is what [WithOnAdmission]'s function learns about one
// message's admission. The charge was clamped when Granted is below
// Charge.Vertices.
type Admission struct {
	Charge  cost.Charge     // what the estimator asked for
	Granted int64           // vertices held, after clamping (0 unless Admitted)
	Wait    time.Duration   // time blocked before admission or giving up
	Result  AdmissionResult // whether the handler ran, or why not
}

// Admitter is a Watermill middleware that admits each message against a
// [VertexBudget] before its handler runs. The charge is refunded when the
// handler returns, whether it succeeded, failed or panicked, so the
// budget's InUse goes back to zero whenever no handler is running. It is
// safe for concurrent use; one Admitter may wrap any number of handlers,
// which then share the budget. Create one with [New].
type Admitter struct {
	budget *VertexBudget
	admitterSettings

	lanes    bool // the budget has lanes
	byMsg    bool // some lane selects by handler or topic
	byCharge bool // some lane selects by charge
}

// New returns the admission middleware for budget, configured by the
// options that belong to it ([WithEstimator], [WithOnAdmission],
// [WithRevoked], [WithMaxPayloadBytes], [WithMaxVertices],
// [WithOnOversize]). It returns [*spillway.FieldError]s, joined, for a nil
// budget, a negative size limit or an option of [NewVertexBudget].
func New(budget *VertexBudget, opts ...Option) (*Admitter, error) {
	o := collect(opts)
	var errs []error
	if budget == nil {
		errs = append(errs, &spillway.FieldError{Field: "budget", Value: "nil", Reason: "required: a *VertexBudget from NewVertexBudget"})
	}
	errs = append(errs, o.checkLimits()...)
	errs = append(errs, misplaced(o.forBudget, "NewVertexBudget", "New")...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if o.estimator == nil {
		o.estimator = cost.NewEstimator(cost.FullBudget)
	}
	m := &Admitter{budget: budget, admitterSettings: o.admitterSettings,
		lanes: len(budget.lanes) > 1, byMsg: budget.selectsByMessage()}
	for i := range budget.lanes {
		m.byCharge = m.byCharge || budget.lanes[i].maxCharge > 0
	}
	return m, nil
}

// Middleware wraps h with budget admission: the message is priced and
// waits for its charge before h runs, and the charge is refunded once h
// has returned, failed or panicked. While h runs the message's context
// carries the charge it was admitted with ([cost.AdmittedFromCtx]); the
// context the middleware received is put back when h returns.
//
// While a message waits it stays unacked, so the subscriber releases no new
// work from that partition or subscription. If the message context ends
// while it waits, the handler is not run and ctx.Err() is returned, so the
// router nacks the message and it is redelivered rather than lost.
func (m *Admitter) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var t ticket
		defer m.release(&t)
		if err := m.admit(msg, &t); !t.admitted() {
			// Refused, stepped aside or cancelled: not run.
			return nil, err
		}
		ctx := msg.Context()
		defer msg.SetContext(ctx)
		msg.SetContext(cost.WithAdmitted(ctx, t.c))
		return h(msg)
	}
}

// ticket is one message's admission: the charge it holds while its
// handler runs. The zero ticket holds nothing.
type ticket struct {
	p Permit
	c cost.Charge
}

// admitted reports whether the message was admitted: it is to be run, and
// the ticket released afterwards.
func (t *ticket) admitted() bool { return t.p.b != nil }

// admit prices msg, waits for its charge, reports the outcome to
// OnAdmission and fills t, which must hold nothing. If t is not admitted
// afterwards, msg must not be run, and the error (nil after a step aside
// or an accepted oversize) is the middleware's result. Otherwise the
// caller runs the handler and then calls release with t, also when the
// handler fails or panics: the caller defers that call before admit, so
// that an OnAdmission hook that panics leaves nothing held.
func (m *Admitter) admit(msg *message.Message, t *ticket) error {
	*t = ticket{}
	if n := m.maxPayloadBytes; n > 0 && len(msg.Payload) > n {
		// Not priced: the estimator may have to parse it.
		return m.oversizePayload(msg, n)
	}
	t.c = m.estimator.Estimate(msg)
	if n := m.maxVertices; n > 0 && t.c.Vertices > n && (t.c.Source == cost.SourceHeader || t.c.Source == cost.SourceComputed) {
		return m.oversizeCharge(msg, t.c, n)
	}
	var abort <-chan struct{}
	if m.revoked != nil {
		var gone bool
		if abort, gone = m.revocation(msg, t); gone {
			return nil
		}
	}
	if err := m.take(msg, t, abort); !t.admitted() {
		return err
	}
	// From here t holds the charge: a hook that panics leaves it to the
	// caller's deferred release.
	if m.onAdmission != nil {
		m.announce(msg, t)
	}
	return nil
}

// release refunds t's charge once its handler has returned. Releasing a
// ticket that holds nothing, or releasing it again, does nothing.
func (m *Admitter) release(t *ticket) {
	if !t.admitted() {
		return
	}
	m.budget.release(t.p)
	t.p = Permit{}
}

// take waits for t's charge: t.p holds the permit afterwards, unless msg
// is not to be run (the error says why, or is nil after a step aside).
func (m *Admitter) take(msg *message.Message, t *ticket, abort <-chan struct{}) error {
	var lane int
	var ok bool
	if m.lanes {
		lane = m.laneOf(msg, t.c)
		t.p, ok = m.budget.admitLaneNow(lane, t.c.Vertices, t.c.Messages)
	} else {
		t.p, ok = m.budget.admitNow(t.c.Vertices, t.c.Messages)
	}
	if ok {
		return nil
	}
	return m.wait(msg, t, lane, abort)
}

// wait is admit's slow path: the charge did not fit at once.
func (m *Admitter) wait(msg *message.Message, t *ticket, lane int, abort <-chan struct{}) error {
	p, err := m.budget.acquire(msg.Context(), lane, t.c.Vertices, t.c.Messages, abort)
	if err == nil {
		t.p = p
		return nil
	}
	switch {
	case errors.Is(err, errRevoked):
		m.stepAside(msg, t.c, p.wait)
		return nil
	case errors.Is(err, errNegativeCost):
		m.observe(msg, Admission{Charge: t.c, Result: Invalid})
		return fmt.Errorf("spillway: admitting message %s: %w", msg.UUID, err)
	default:
		m.observe(msg, Admission{Charge: t.c, Wait: p.wait, Result: Cancelled})
		return err
	}
}

// revocation returns msg's revocation channel (Revoked) and whether it is
// closed already, in which case msg steps aside at once.
func (m *Admitter) revocation(msg *message.Message, t *ticket) (<-chan struct{}, bool) {
	abort := m.revoked(msg)
	if abort == nil {
		return nil, false
	}
	select {
	case <-abort:
		m.stepAside(msg, t.c, 0)
		return abort, true
	default:
		return abort, false
	}
}

// announce reports t's admission (OnAdmission).
func (m *Admitter) announce(msg *message.Message, t *ticket) {
	p := &t.p
	m.onAdmission(msg, Admission{Charge: t.c, Granted: p.vertices(), Wait: p.wait, Result: Admitted})
}

// oversizePayload refuses msg for its payload's size.
func (m *Admitter) oversizePayload(msg *message.Message, limit int) error {
	return m.oversize(msg, cost.Charge{Vertices: cost.FullBudget, Messages: 1, Source: cost.SourceMissing},
		fmt.Sprintf("payload of %d bytes, limit %d", len(msg.Payload), limit))
}

// oversizeCharge refuses msg for its charge.
func (m *Admitter) oversizeCharge(msg *message.Message, c cost.Charge, limit int64) error {
	return m.oversize(msg, c, fmt.Sprintf("charge of %d vertices, limit %d", c.Vertices, limit))
}

// laneOf returns the index of msg's lane in the budget (see [Lane]).
func (m *Admitter) laneOf(msg *message.Message, c cost.Charge) int {
	var handler, topic string
	if m.byMsg {
		ctx := msg.Context()
		handler, topic = message.HandlerNameFromCtx(ctx), message.SubscribeTopicFromCtx(ctx)
	}
	return m.budget.laneFor(handler, topic, c.Vertices)
}

// SaturatedForMessage is the pressure signal of msg's lane: how long the
// lane's next charge has had to wait without a break, or 0. With lanes,
// shedding and the retry gate judge a message by its own lane, so that
// saturation of a heavy lane does not make the light lane shed; a lane
// within its reservation is not saturated by the others. Without lanes it is the budget's
// [VertexBudget.SaturatedFor]. It prices msg with the estimator when a
// lane selects by charge.
func (m *Admitter) SaturatedForMessage(msg *message.Message) time.Duration {
	b := m.budget
	if !m.lanes {
		return b.SaturatedFor()
	}
	var c cost.Charge
	if m.byCharge {
		c = m.estimator.Estimate(msg)
	}
	return b.saturatedFor(b.lanes[m.laneOf(msg, c)].saturatedSince.Load())
}

// oversize refuses msg: the WithOnOversize function takes it, or the error wraps
// ErrOversize.
func (m *Admitter) oversize(msg *message.Message, c cost.Charge, why string) error {
	a := Admission{Charge: c, Result: Oversize}
	m.observe(msg, a)
	if m.onOversize != nil {
		err := m.onOversize(msg, a)
		if err == nil {
			return nil
		}
		return fmt.Errorf("%w: message %s: %s: %w", ErrOversize, msg.UUID, why, err)
	}
	return fmt.Errorf("%w: message %s: %s", ErrOversize, msg.UUID, why)
}

// stepAside records that msg stepped aside (Revoked).
func (m *Admitter) stepAside(msg *message.Message, c cost.Charge, wait time.Duration) {
	m.observe(msg, Admission{Charge: c, Wait: wait, Result: Revoked})
}

func (m *Admitter) observe(msg *message.Message, a Admission) {
	if m.onAdmission != nil {
		m.onAdmission(msg, a)
	}
}
