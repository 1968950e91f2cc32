package middleware

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
)

// Outcome is how a message left budget admission. Its value is the name
// logs, span attributes and metric labels use.
type Outcome string

const (
	// Admitted: the charge was granted and the handler ran.
	Admitted Outcome = "admitted"
	// Cancelled: the message context ended while waiting; the handler did
	// not run and the message is nacked.
	Cancelled Outcome = "cancelled"
	// Revoked: the message's delivery was revoked while it waited (its
	// Kafka session ended); the handler did not run and the message is
	// acked without effect, so the partition's next owner processes it.
	Revoked Outcome = "revoked"
	// Invalid: the charge could not be admitted at all (a negative cost
	// from a custom estimator); the message is nacked.
	Invalid Outcome = "invalid"
	// Oversize: the payload is above [BudgetConfig.MaxPayloadBytes] or the
	// charge above [BudgetConfig.MaxVertices]; the handler did not run and
	// the message went to [BudgetConfig.OnOversize], or failed with
	// [ErrOversize].
	Oversize Outcome = "oversize"
)

// ErrOversize is wrapped by the error the middleware returns for a message
// it refuses as too large ([Oversize]) when no [BudgetConfig.OnOversize]
// takes it. It wraps [cost.ErrTooLarge], so the retry gate's default
// classifier (retrygate.IsPermanent) dead-letters the message at once
// instead of retrying it.
var ErrOversize = fmt.Errorf("spillway: message too large to admit: %w", cost.ErrTooLarge)

// Admission describes one message's passage through the budget.
type Admission struct {
	Charge  cost.Charge   // what the estimator asked for
	Granted int64         // vertices held, after clamping (0 unless Admitted)
	Clamped bool          // the charge exceeded the capacity
	Wait    time.Duration // time blocked before admission or giving up
	Outcome Outcome
}

// BudgetConfig configures the [Budget] middleware.
type BudgetConfig struct {
	// Budget is the vertex budget messages are admitted against. Required.
	Budget *VertexBudget

	// Estimator prices each message. Default: cost.NewEstimator(cost.FullBudget),
	// which reads vertex_count and charges the whole budget when it is
	// missing or malformed.
	Estimator cost.ChargeEstimator

	// Revoked, if set, returns a channel that is closed when msg's delivery
	// has been revoked: its Kafka session ended in a rebalance, say. A
	// message still waiting for budget when that happens steps aside at
	// once: the handler does not run and the message is acked, which
	// watermill-kafka does not commit once the session is gone, so the
	// partition's next owner processes it. Admitted work is never
	// interrupted. A nil channel means the delivery cannot be revoked.
	Revoked func(msg *message.Message) <-chan struct{}

	// MaxPayloadBytes refuses a message whose payload is larger, before it
	// is priced: decoding takes memory in proportion to the bytes, and a
	// payload above what the memory bound can hold must not run at all.
	// 0 means no limit.
	MaxPayloadBytes int

	// MaxVertices refuses a message whose counted charge (a vertex_count
	// header or a computed count, not the default charge of an unknown
	// cost) is above it. Use the largest message that finishes alone
	// within the redelivery deadline (sizing.Bounds.SoloLimit):
	// one message runs on one core, so a bigger one would hold a
	// rebalance or a claim however big the budget is. 0 means no limit: a
	// charge above the capacity is clamped and runs alone.
	MaxVertices int64

	// OnOversize, if set, takes a refused message instead of the handler:
	// it publishes it elsewhere (an oversize topic consumed with a longer
	// deadline, a dead-letter topic) and returns nil, and the message is
	// acked; an error it returns is returned instead, wrapping
	// [ErrOversize]. Without it the middleware returns an error wrapping
	// ErrOversize, which a retry gate dead-letters. It runs on the
	// message's goroutine and holds no budget.
	OnOversize func(msg *message.Message, a Admission) error

	// OnAdmission, if set, is called once per message after admission has
	// been decided, from the message's goroutine, before the handler runs.
	// It must be fast and must not block.
	OnAdmission func(msg *message.Message, a Admission)
}

func (c *BudgetConfig) setDefaults() {
	if c.Estimator == nil {
		c.Estimator = cost.NewEstimator(cost.FullBudget)
	}
}

// Validate reports whether the configuration can be used: a
// [*spillway.FieldError] for Budget if it is nil, or for MaxPayloadBytes or
// MaxVertices if negative.
func (c BudgetConfig) Validate() error {
	switch {
	case c.Budget == nil:
		return &spillway.FieldError{Field: "Budget", Value: "nil", Reason: "required"}
	case c.MaxPayloadBytes < 0:
		return &spillway.FieldError{Field: "MaxPayloadBytes", Value: strconv.Itoa(c.MaxPayloadBytes), Reason: "must not be negative"}
	case c.MaxVertices < 0:
		return &spillway.FieldError{Field: "MaxVertices", Value: strconv.FormatInt(c.MaxVertices, 10), Reason: "must not be negative"}
	}
	return nil
}

// Budget is a Watermill middleware that admits each message against a
// [VertexBudget] before its handler runs. The charge is refunded when the
// handler returns, whether it succeeded, failed or panicked, so InUse goes
// back to zero whenever no handler is running. It is safe for concurrent use;
// one Budget may wrap any number of handlers, which then share the budget.
type Budget struct {
	cfg      BudgetConfig
	lanes    bool // the budget has lanes
	byMsg    bool // some lane selects by handler or topic
	byCharge bool // some lane selects by charge
}

// NewBudget returns the middleware for cfg.
func NewBudget(cfg BudgetConfig) (*Budget, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := cfg.Budget
	m := &Budget{cfg: cfg, lanes: len(b.lanes) > 1, byMsg: b.selectsByMessage()}
	for i := range b.lanes {
		m.byCharge = m.byCharge || b.lanes[i].maxCharge > 0
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
func (m *Budget) Middleware(h message.HandlerFunc) message.HandlerFunc {
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
func (m *Budget) admit(msg *message.Message, t *ticket) error {
	*t = ticket{}
	if n := m.cfg.MaxPayloadBytes; n > 0 && len(msg.Payload) > n {
		// Not priced: the estimator may have to parse it.
		return m.oversizePayload(msg, n)
	}
	t.c = m.cfg.Estimator.Estimate(msg)
	if n := m.cfg.MaxVertices; n > 0 && t.c.Vertices > n && (t.c.Source == cost.SourceHeader || t.c.Source == cost.SourceComputed) {
		return m.oversizeCharge(msg, t.c, n)
	}
	var abort <-chan struct{}
	if m.cfg.Revoked != nil {
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
	if m.cfg.OnAdmission != nil {
		m.announce(msg, t)
	}
	return nil
}

// release refunds t's charge once its handler has returned. Releasing a
// ticket that holds nothing, or releasing it again, does nothing.
func (m *Budget) release(t *ticket) {
	if !t.admitted() {
		return
	}
	m.cfg.Budget.release(t.p)
	t.p = Permit{}
}

// take waits for t's charge: t.p holds the permit afterwards, unless msg
// is not to be run (the error says why, or is nil after a step aside).
func (m *Budget) take(msg *message.Message, t *ticket, abort <-chan struct{}) error {
	var lane int
	var ok bool
	if m.lanes {
		lane = m.laneOf(msg, t.c)
		t.p, ok = m.cfg.Budget.admitLaneNow(lane, t.c.Vertices, t.c.Messages)
	} else {
		t.p, ok = m.cfg.Budget.admitNow(t.c.Vertices, t.c.Messages)
	}
	if ok {
		return nil
	}
	return m.wait(msg, t, lane, abort)
}

// wait is admit's slow path: the charge did not fit at once.
func (m *Budget) wait(msg *message.Message, t *ticket, lane int, abort <-chan struct{}) error {
	p, err := m.cfg.Budget.acquire(msg.Context(), lane, t.c.Vertices, t.c.Messages, abort)
	if err == nil {
		t.p = p
		return nil
	}
	switch {
	case errors.Is(err, errRevoked):
		m.stepAside(msg, t.c, p.wait)
		return nil
	case errors.Is(err, ErrNegativeCost):
		m.observe(msg, Admission{Charge: t.c, Outcome: Invalid})
		return fmt.Errorf("spillway: admitting message %s: %w", msg.UUID, err)
	default:
		m.observe(msg, Admission{Charge: t.c, Wait: p.wait, Outcome: Cancelled})
		return err
	}
}

// revocation returns msg's revocation channel (Revoked) and whether it is
// closed already, in which case msg steps aside at once.
func (m *Budget) revocation(msg *message.Message, t *ticket) (<-chan struct{}, bool) {
	abort := m.cfg.Revoked(msg)
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
func (m *Budget) announce(msg *message.Message, t *ticket) {
	p := &t.p
	m.cfg.OnAdmission(msg, Admission{Charge: t.c, Granted: p.vertices(), Clamped: p.clamped(), Wait: p.wait, Outcome: Admitted})
}

// oversizePayload refuses msg for its payload's size.
func (m *Budget) oversizePayload(msg *message.Message, limit int) error {
	return m.oversize(msg, cost.Charge{Vertices: cost.FullBudget, Messages: 1, Source: cost.SourceMissing},
		fmt.Sprintf("payload of %d bytes, limit %d", len(msg.Payload), limit))
}

// oversizeCharge refuses msg for its charge.
func (m *Budget) oversizeCharge(msg *message.Message, c cost.Charge, limit int64) error {
	return m.oversize(msg, c, fmt.Sprintf("charge of %d vertices, limit %d", c.Vertices, limit))
}

// laneOf returns the index of msg's lane in the budget (see [Lane]).
func (m *Budget) laneOf(msg *message.Message, c cost.Charge) int {
	var handler, topic string
	if m.byMsg {
		ctx := msg.Context()
		handler, topic = message.HandlerNameFromCtx(ctx), message.SubscribeTopicFromCtx(ctx)
	}
	return m.cfg.Budget.laneFor(handler, topic, c.Vertices)
}

// SaturatedForMessage is the pressure signal of msg's lane
// ([VertexBudget.LaneSaturatedFor]): with lanes, shedding and the retry
// gate judge a message by its own lane, so that saturation of a heavy lane
// does not make the light lane shed. Without lanes it is the budget's
// [VertexBudget.SaturatedFor]. It prices msg with the estimator when a
// lane selects by charge.
func (m *Budget) SaturatedForMessage(msg *message.Message) time.Duration {
	b := m.cfg.Budget
	if !m.lanes {
		return b.SaturatedFor()
	}
	var c cost.Charge
	if m.byCharge {
		c = m.cfg.Estimator.Estimate(msg)
	}
	return b.saturatedFor(b.lanes[m.laneOf(msg, c)].saturatedSince.Load())
}

// oversize refuses msg: OnOversize takes it, or the error wraps
// ErrOversize.
func (m *Budget) oversize(msg *message.Message, c cost.Charge, why string) error {
	a := Admission{Charge: c, Outcome: Oversize}
	m.observe(msg, a)
	if m.cfg.OnOversize != nil {
		err := m.cfg.OnOversize(msg, a)
		if err == nil {
			return nil
		}
		return fmt.Errorf("%w: message %s: %s: %w", ErrOversize, msg.UUID, why, err)
	}
	return fmt.Errorf("%w: message %s: %s", ErrOversize, msg.UUID, why)
}

// stepAside records that msg stepped aside (Revoked).
func (m *Budget) stepAside(msg *message.Message, c cost.Charge, wait time.Duration) {
	m.observe(msg, Admission{Charge: c, Wait: wait, Outcome: Revoked})
}

func (m *Budget) observe(msg *message.Message, a Admission) {
	if m.cfg.OnAdmission != nil {
		m.cfg.OnAdmission(msg, a)
	}
}
