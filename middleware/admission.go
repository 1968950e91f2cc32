package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/granted"
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
)

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
// [*spillway.FieldError] for Budget if it is nil.
func (c BudgetConfig) Validate() error {
	if c.Budget == nil {
		return &spillway.FieldError{Field: "Budget", Value: "nil", Reason: "required"}
	}
	return nil
}

// Budget is a Watermill middleware that admits each message against a
// [VertexBudget] before its handler runs. The charge is refunded when the
// handler returns, whether it succeeded, failed or panicked, so InUse goes
// back to zero whenever no handler is running. It is safe for concurrent use;
// one Budget may wrap any number of handlers, which then share the budget.
type Budget struct {
	cfg BudgetConfig
}

// NewBudget returns the middleware for cfg.
func NewBudget(cfg BudgetConfig) (*Budget, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Budget{cfg: cfg}, nil
}

// Middleware wraps h with budget admission.
//
// While a message waits it stays unacked, so the subscriber releases no new
// work from that partition or subscription. If the message context ends
// while it waits, the handler is not run and ctx.Err() is returned, so the
// router nacks the message and it is redelivered rather than lost.
func (m *Budget) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		c := m.cfg.Estimator.Estimate(msg)
		var abort <-chan struct{}
		if m.cfg.Revoked != nil {
			abort = m.cfg.Revoked(msg)
			if abort != nil {
				select {
				case <-abort:
					return m.stepAside(msg, c, 0)
				default:
				}
			}
		}
		p, err := m.cfg.Budget.acquire(msg.Context(), c.Vertices, c.Messages, abort)
		if err != nil {
			switch {
			case errors.Is(err, errRevoked):
				return m.stepAside(msg, c, p.wait)
			case errors.Is(err, ErrNegativeCost):
				m.observe(msg, Admission{Charge: c, Outcome: Invalid})
				return nil, fmt.Errorf("spillway: admitting message %s: %w", msg.UUID, err)
			default:
				m.observe(msg, Admission{Charge: c, Wait: p.wait, Outcome: Cancelled})
				return nil, err
			}
		}
		defer m.cfg.Budget.release(p)
		m.observe(msg, Admission{Charge: c, Granted: p.vertices, Clamped: p.clamped, Wait: p.wait, Outcome: Admitted})
		// The layers inside (the auto-sizer) read the granted charge
		// instead of pricing the message again.
		prev, had := granted.Set(msg, granted.Charge{Requested: c.Vertices, Vertices: p.vertices, Clamped: p.clamped, Source: c.Source})
		defer granted.Restore(msg, prev, had)
		return h(msg)
	}
}

func (m *Budget) stepAside(msg *message.Message, c cost.Charge, wait time.Duration) ([]*message.Message, error) {
	m.observe(msg, Admission{Charge: c, Wait: wait, Outcome: Revoked})
	return nil, nil
}

func (m *Budget) observe(msg *message.Message, a Admission) {
	if m.cfg.OnAdmission != nil {
		m.cfg.OnAdmission(msg, a)
	}
}
