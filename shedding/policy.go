package shedding

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
)

// Metadata keys set on audit copies of dropped messages. A consumer of the
// audit topic reads the reason, and replays a copy by publishing it back to
// its topic.
const (
	// MetadataReason holds the reason the message was dropped for:
	// shed_priority, stale_version or superseded (see [WithOnShed]).
	MetadataReason = "spillway_shed_reason"
	// MetadataTopic holds the topic the message was consumed from.
	MetadataTopic = "spillway_shed_topic"
	// metadataAt holds when it was dropped, RFC 3339 with nanoseconds, UTC
	// (spillway_shed_at).
	metadataAt = "spillway_shed_at"
)

// reason says why a message was dropped. Outside the package it is its
// String form: the hook's reason, the audit copy's [MetadataReason] and the
// reason label of the metrics.
type reason uint8

const (
	// reasonPriority: its priority was below the threshold while pressure
	// had lasted longer than the window.
	reasonPriority reason = iota + 1
	// reasonStale: its version was not newer than the last version handled
	// for its entity.
	reasonStale
	// reasonSuperseded: a newer message for its entity arrived while it
	// waited for budget (or was already in flight when it arrived).
	reasonSuperseded
)

var reasonNames = [...]string{
	reasonPriority:   "shed_priority",
	reasonStale:      "stale_version",
	reasonSuperseded: "superseded",
}

// String returns shed_priority, stale_version or superseded.
func (r reason) String() string {
	if r > 0 && int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// options are a policy's runtime dependencies, set by the With… functions.
type options struct {
	pressure     spillway.Pressure
	audit        message.Publisher
	onShed       func(*message.Message, string, string)
	topicOf      func(*message.Message) string
	isRedelivery func(*message.Message) bool
}

// Option configures a [Policy] built by [New].
type Option func(*options)

// WithPressure sets the pressure signal priority shedding waits on
// ([spillway.Pressure]; *middleware.VertexBudget satisfies it). It is
// required while there are sheddable topics and priority shedding is on:
// without it [New] returns a [*spillway.FieldError] for
// priority.disabled. The version guard and coalescing do not read it.
func WithPressure(p spillway.Pressure) Option {
	return func(o *options) { o.pressure = p }
}

// WithAuditPublisher sets the publisher audit copies are published with, to
// Config.AuditTopic. Without an audit topic the publisher is not used. The
// policy does not close it.
func WithAuditPublisher(pub message.Publisher) Option {
	return func(o *options) { o.audit = pub }
}

// WithOnShed sets a hook called once for every message the policy drops,
// after its audit copy (if any) has been published and before it is acked:
// attach metrics here. reason is "shed_priority" (priority below the
// threshold while pressure had lasted longer than the window),
// "stale_version" (version not newer than the last one handled for its
// entity) or "superseded" (a newer message for its entity arrived while it
// waited for budget, or was already in flight when it arrived). It is called from the message's goroutine, must be
// fast, must not block and must be safe for concurrent use.
func WithOnShed(f func(msg *message.Message, topic, reason string)) Option {
	return func(o *options) { o.onShed = f }
}

// WithRedelivery sets how redelivered messages are recognised: f reports
// whether msg was delivered before (a broker redelivery, a retry copy).
// Coalescing without versions on both messages goes by arrival order, and
// a redelivery's arrival says nothing about its age, so a redelivery
// never supersedes a message of its entity that is in flight: it is handled
// alongside it, uncoalesced. A later fresh message still supersedes a
// waiting redelivery, and with versions on both the higher version wins
// as always. Without this option every message counts as fresh. f is
// called from message goroutines and must be safe for concurrent use.
func WithRedelivery(f func(msg *message.Message) bool) Option {
	return func(o *options) { o.isRedelivery = f }
}

// WithTopicFunc sets how a message's topic is found. The default reads the
// topic the router subscribed to, message.SubscribeTopicFromCtx. Use it when
// a handler consumes a fan-in of several streams and the original topic is
// carried elsewhere.
func WithTopicFunc(f func(msg *message.Message) string) Option {
	return func(o *options) {
		if f != nil {
			o.topicOf = f
		}
	}
}

// Policy drops messages of an explicit list of self-superseding topics, and
// only those: by priority under sustained pressure, by stale version, and
// by coalescing waiters for the same entity. Every drop is counted by topic
// and reason, optionally published to an audit topic, and acked. Nothing
// else is ever dropped: a message of any other topic passes through
// untouched.
//
// A Policy contributes two middlewares that go on either side of budget
// admission:
//
//   - [Policy.Middleware], before admission: drops stale and (under
//     sustained pressure) low-priority messages before they wait for
//     budget, and registers the message for coalescing.
//   - [Policy.Admitted], inside admission, right before the handler:
//     checks again after the wait, marks the message admitted (admitted
//     messages are never superseded) and records the handled version.
//
// Add them in that order around the admission middleware (Watermill's
// first middleware is the outermost):
//
//	router.AddMiddleware(policy.Middleware, admission.Middleware, policy.Admitted)
//
// Coalescing also needs [Policy.Revoked] as the budget's revocation hook,
// so that a superseded waiter stops waiting.
//
// A Policy is safe for concurrent use; one Policy may wrap any number of
// handlers. Create it with [New].
type Policy struct {
	cfg      Config
	pressure spillway.Pressure
	audit    message.Publisher
	onShed   func(*message.Message, string, string)
	topicOf  func(*message.Message) string

	isRedelivery func(*message.Message) bool // nil: every message is fresh

	topics map[string]*topicCounters // the allow-list; read-only after New
	guard  *versionGuard             // nil: version guard off
	coal   *coalescer                // nil: coalescing off

	// admittedHook is set once Admitted has been installed in a handler
	// chain. Until then a waiting message is never made to step aside,
	// because its fate could not be told from a handled message's.
	admittedHook atomic.Bool
}

type topicCounters struct {
	dropped           [len(reasonNames)]atomic.Uint64
	auditFailed       atomic.Uint64
	malformedPriority atomic.Uint64
	malformedVersion  atomic.Uint64
}

// New returns the policy for cfg. Errors are those of [Config.Validate],
// or a [*spillway.FieldError]: for priority.disabled when there are
// sheddable topics, priority shedding is on and no [WithPressure] was
// given; for audit_topic when it is set and no [WithAuditPublisher] was.
func New(cfg Config, opts ...Option) (*Policy, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := options{topicOf: func(m *message.Message) string { return message.SubscribeTopicFromCtx(m.Context()) }}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	p := &Policy{
		cfg:          cfg,
		pressure:     o.pressure,
		audit:        o.audit,
		onShed:       o.onShed,
		topicOf:      o.topicOf,
		isRedelivery: o.isRedelivery,
		topics:       make(map[string]*topicCounters, len(cfg.Topics)),
	}
	if len(cfg.Topics) > 0 && !cfg.Priority.Disabled && p.pressure == nil {
		return nil, &spillway.FieldError{Field: "priority.disabled", Value: "false", Reason: "priority shedding is on but no pressure signal was given: pass WithPressure, or set priority.disabled: true"}
	}
	if cfg.AuditTopic == "" {
		p.audit = nil
	} else if p.audit == nil {
		return nil, &spillway.FieldError{Field: "audit_topic", Value: cfg.AuditTopic, Reason: "set, but no audit publisher was given (WithAuditPublisher)"}
	}
	for _, t := range cfg.Topics {
		p.topics[t] = new(topicCounters)
	}
	if cfg.VersionGuard.Enabled {
		p.guard = newVersionGuard(cfg.VersionGuard.MaxEntities)
	}
	if cfg.Coalesce.Enabled {
		p.coal = newCoalescer()
	}
	return p, nil
}

// shedding reports whether priority shedding is in force now: pressure has
// lasted at least the window. With a message, a pressure signal that can
// judge each message by itself (a budget split into lanes: the message's
// own lane, see middleware.Admitter.SaturatedForMessage) is asked about
// that message. It is lock-free.
func (p *Policy) shedding(msg *message.Message) bool {
	if p.cfg.Priority.Disabled || p.pressure == nil || len(p.topics) == 0 {
		return false
	}
	if mp, ok := p.pressure.(messagePressure); ok && msg != nil {
		return mp.SaturatedForMessage(msg) >= p.cfg.Priority.Window
	}
	return p.pressure.SaturatedFor() >= p.cfg.Priority.Window
}

// messagePressure is a pressure signal that can also judge one message by
// the part of the consumer it needs.
type messagePressure interface {
	SaturatedForMessage(msg *message.Message) time.Duration
}

// passage is what the policy knows about one message on its way through
// the handler chain. It travels in the message context.
type passage struct {
	topic      string
	tc         *topicCounters
	priority   int64
	entity     string
	version    uint64
	hasVersion bool
	ticket     *ticket // nil: not coalesced

	// Written by Admitted, read by Middleware; both run on the message's
	// goroutine, one inside the other.
	admitted bool // the handler was called
	dropped  bool // Admitted dropped the message (or failed to)
}

func (ps *passage) key() entityKey { return entityKey{ps.topic, ps.entity} }

type passageKey struct{}

func passageOf(msg *message.Message) *passage {
	ps, _ := msg.Context().Value(passageKey{}).(*passage)
	return ps
}

// inspect reads the metadata the policy needs, once per message.
func (p *Policy) inspect(msg *message.Message, topic string, tc *topicCounters) *passage {
	ps := &passage{topic: topic, tc: tc}
	if !p.cfg.Priority.Disabled {
		n, f := parsePriority(msg.Metadata.Get(p.cfg.Priority.Key))
		if f != fieldOK {
			n = p.cfg.Priority.Missing
			if f == fieldMalformed {
				tc.malformedPriority.Add(1)
			}
		}
		ps.priority = n
	}
	if p.guard != nil || p.coal != nil {
		ps.entity = msg.Metadata.Get(p.cfg.EntityKey)
		if ps.entity != "" {
			v, f := parseVersion(msg.Metadata.Get(p.cfg.VersionKey))
			switch f {
			case fieldOK:
				ps.version, ps.hasVersion = v, true
			case fieldMalformed:
				tc.malformedVersion.Add(1)
			}
		}
	}
	return ps
}

// verdict decides whether a message must be dropped now, before or after
// waiting for budget. A stale version is reported before a low priority.
func (p *Policy) verdict(msg *message.Message, ps *passage) (reason, bool) {
	if p.guard != nil && ps.hasVersion && p.guard.stale(ps.key(), ps.version) {
		return reasonStale, true
	}
	if ps.priority < p.cfg.Priority.ShedBelow && p.shedding(msg) {
		return reasonPriority, true
	}
	return 0, false
}

// Middleware is the policy's stage before budget admission. For a message
// of a sheddable topic it drops the message, without waiting for budget,
// if its version is stale or if it has low priority while shedding is in
// force; otherwise it registers it for coalescing and calls h. A message of
// any other topic goes straight to h.
//
// A dropped message is counted, published to the audit topic if one is
// configured, and acked (nil error). If publishing the audit copy fails,
// the error is returned instead, so the message is nacked and redelivered:
// nothing is dropped silently.
func (p *Policy) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		topic := p.topicOf(msg)
		tc := p.topics[topic]
		if tc == nil {
			return h(msg)
		}
		ps := p.inspect(msg, topic, tc)
		if r, drop := p.verdict(msg, ps); drop {
			return p.drop(msg, ps, r)
		}
		if p.coal != nil && ps.entity != "" {
			redelivery := p.isRedelivery != nil && p.isRedelivery(msg)
			t, a := p.coal.register(ps.key(), msg.UUID, ps.version, ps.hasVersion, redelivery, p.admittedHook.Load())
			if a == arrivedOlder {
				return p.drop(msg, ps, reasonSuperseded)
			}
			if t != nil {
				ps.ticket = t
				defer p.coal.finish(t)
			}
		}
		msg.SetContext(context.WithValue(msg.Context(), passageKey{}, ps))
		out, err := h(msg)
		if ps.ticket != nil && !ps.admitted && !ps.dropped && err == nil && p.coal.wasSuperseded(ps.ticket) {
			// Admission stepped aside because a newer message arrived.
			return p.drop(msg, ps, reasonSuperseded)
		}
		return out, err
	}
}

// Admitted is the policy's stage after budget admission, right before the
// handler. It must sit inside the admission middleware (see [Policy]). For a message that passed [Policy.Middleware] it checks once
// more what may have changed during the wait (the message was superseded,
// a newer version was handled, shedding came into force) and drops the
// message if so; otherwise it marks the message admitted, so it is no
// longer superseded, and calls h. When h succeeds it records the message's
// version for the version guard; the version counts once the message is
// acked. Messages that did not pass Middleware go straight to h.
//
// Without Admitted in the chain the version guard never records anything
// (so it never drops) and waiting messages are never superseded.
func (p *Policy) Admitted(h message.HandlerFunc) message.HandlerFunc {
	p.admittedHook.Store(true)
	return func(msg *message.Message) ([]*message.Message, error) {
		ps := passageOf(msg)
		if ps == nil {
			return h(msg)
		}
		if ps.ticket != nil && !p.coal.admit(ps.ticket) {
			ps.dropped = true
			return p.drop(msg, ps, reasonSuperseded)
		}
		if r, drop := p.verdict(msg, ps); drop {
			ps.dropped = true
			return p.drop(msg, ps, r)
		}
		ps.admitted = true
		out, err := h(msg)
		if err == nil && p.guard != nil && ps.hasVersion {
			p.guard.record(ps.key(), ps.version, msg.Acked())
		}
		return out, err
	}
}

// Revoked returns a revocation hook for middleware.WithRevoked
// whose channel is closed when msg, while waiting for budget, is
// superseded by a newer message of its entity, or when also(msg) fires,
// whichever comes first; and at the latest when msg leaves the policy.
// also may be nil; typically it is the Kafka session tracker's Revoked.
// With also nil, the hook returns nil for a message that cannot be
// superseded: coalescing off, a topic that is not sheddable, no entity
// key, or a message that did not pass [Policy.Middleware].
//
// When only one of the two channels exists (the common case: coalescing
// has nothing to do on Kafka, and nothing revokes deliveries on other
// brokers) it is returned as is. When both exist, one goroutine per message
// forwards also's signal; it ends when the message leaves the policy at the
// latest. A step-aside caused by also is not counted as superseded.
func (p *Policy) Revoked(also func(msg *message.Message) <-chan struct{}) func(msg *message.Message) <-chan struct{} {
	return func(msg *message.Message) <-chan struct{} {
		var other <-chan struct{}
		if also != nil {
			other = also(msg)
		}
		ps := passageOf(msg)
		if ps == nil || ps.ticket == nil {
			return other
		}
		t := ps.ticket
		if other == nil {
			return t.abort
		}
		select {
		case <-other:
			p.coal.revoke(t)
			return t.abort
		default:
		}
		go func() {
			select {
			case <-other:
				p.coal.revoke(t)
			case <-t.abort:
			}
		}()
		return t.abort
	}
}

// drop counts msg as dropped for reason, publishes its audit copy and
// acks it; if the audit copy cannot be published it returns the error so
// the message is nacked.
func (p *Policy) drop(msg *message.Message, ps *passage, r reason) ([]*message.Message, error) {
	if p.audit != nil {
		a := msg.Copy()
		a.Metadata.Set(MetadataReason, r.String())
		a.Metadata.Set(MetadataTopic, ps.topic)
		a.Metadata.Set(metadataAt, time.Now().UTC().Format(time.RFC3339Nano))
		// Keep the values (tracing) but not the cancellation of the
		// delivery: the copy must go out even if the delivery is ending.
		a.SetContext(context.WithoutCancel(msg.Context()))
		if err := p.audit.Publish(p.cfg.AuditTopic, a); err != nil {
			ps.tc.auditFailed.Add(1)
			return nil, fmt.Errorf("shedding: message %s of topic %q dropped as %s, but its audit copy could not be published to %q (message not acked): %w",
				msg.UUID, ps.topic, r, p.cfg.AuditTopic, err)
		}
	}
	ps.tc.dropped[r].Add(1)
	if p.onShed != nil {
		p.onShed(msg, ps.topic, r.String())
	}
	return nil, nil
}

// Stats is a point-in-time snapshot of a [Policy]: what the metrics do not
// show. The drops themselves are counted by topic and reason by the
// spillway.messages.shed and .superseded metrics (telemetry.Metrics.OnShed
// as the [WithOnShed] hook).
type Stats struct {
	// Shedding is whether priority shedding is in force now.
	Shedding bool
	// AuditFailed counts drops whose audit copy could not be published;
	// those messages were nacked instead.
	AuditFailed uint64
	// MalformedPriority counts messages whose priority metadata was
	// present but not an integer (they were given priority.missing).
	MalformedPriority uint64
	// MalformedVersion counts messages whose version metadata was present
	// but not an unsigned integer (the version guard skipped them).
	MalformedVersion uint64
	// Entities is how many entities the version guard remembers, at most
	// version_guard.max_entities.
	Entities int
	// Forgotten counts the entities the version guard has forgotten to
	// stay within version_guard.max_entities; a forgotten entity's next
	// message is handled whatever its version.
	Forgotten uint64
}

// Stats returns a snapshot. Counters are read one by one, so a snapshot
// taken while messages flow may be off by the messages in flight.
func (p *Policy) Stats() Stats {
	s := Stats{Shedding: p.shedding(nil)}
	for _, tc := range p.topics {
		s.AuditFailed += tc.auditFailed.Load()
		s.MalformedPriority += tc.malformedPriority.Load()
		s.MalformedVersion += tc.malformedVersion.Load()
	}
	if p.guard != nil {
		s.Entities, s.Forgotten = p.guard.stats()
	}
	return s
}
