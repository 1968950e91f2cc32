package telemetry

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
)

// Spillway's span attributes. Messaging attributes follow OpenTelemetry's
// semantic conventions; these describe what Spillway did with the message.
const (
	// keyVertices is the message's cost in vertices, when it is known (read
	// from vertex_count or counted from the payload); omitted when the
	// count was missing or malformed and the default was charged.
	keyVertices = attribute.Key("spillway.vertices")
	// keyVerticesGranted is the charge the budget admitted, after clamping.
	keyVerticesGranted = attribute.Key("spillway.vertices.granted")
	// keyCostSource is where the count came from: header, missing,
	// malformed or computed (cost.Source).
	keyCostSource = attribute.Key("spillway.cost.source")
	// keyAdmission is how admission ended: admitted, cancelled, revoked or
	// invalid (middleware.AdmissionResult).
	keyAdmission = attribute.Key("spillway.admission.outcome")
	// keyAdmissionWait is the time spent waiting for budget, in seconds.
	keyAdmissionWait = attribute.Key("spillway.admission.wait_seconds")
	// keyAdmissionClamped is true when the charge exceeded the capacity.
	keyAdmissionClamped = attribute.Key("spillway.admission.clamped")
	// keyOutcome is how the message left the stack (an outcome).
	keyOutcome = attribute.Key("spillway.outcome")
	// keyReason qualifies the outcome: why it was shed, deferred or
	// dead-lettered.
	keyReason = attribute.Key("spillway.outcome.reason")
	// keyAttempt is the retry attempt count read from message metadata
	// (spillway_attempt, written by Spillway's retry gate).
	keyAttempt = attribute.Key("spillway.retry.attempt")
)

// outcome is how a message left Spillway's middleware stack: the
// spillway.outcome span attribute and the outcome metric attribute
// (docs/operations.md lists them all). The hooks of the stages that drop,
// defer or dead-letter messages record the first five ([Metrics.OnShed],
// [Metrics.OnDeferred], [Metrics.OnDeadLettered], [Metrics.OnAdmission]
// for a revoked admission); the stack records the others itself.
type outcome string

const (
	// outcomeShed: dropped by a shedding policy (priority or stale version).
	outcomeShed outcome = "shed"
	// outcomeSuperseded: dropped because a newer message for its entity
	// arrived while it waited.
	outcomeSuperseded outcome = "superseded"
	// outcomeDeferred: handed back for a later retry.
	outcomeDeferred outcome = "deferred"
	// outcomeDeadLettered: failed for good and sent to the dead-letter topic.
	outcomeDeadLettered outcome = "dead_lettered"
	// outcomeReleased: stepped aside while waiting for budget because its
	// delivery was revoked in a rebalance; the next owner processes it.
	// Counted (spillway.messages.released_on_rebalance) by
	// [Metrics.OnAdmission].
	outcomeReleased outcome = "released_on_rebalance"
	// outcomeHandled: the handler ran and returned nil.
	outcomeHandled outcome = "handled"
	// outcomeError: the chain returned an error; the message is nacked.
	outcomeError outcome = "error"
	// outcomePanic: the handler panicked.
	outcomePanic outcome = "panic"
	// outcomeCancelled: its context ended while it waited for budget.
	outcomeCancelled outcome = "cancelled"
	// outcomeInvalid: its charge could not be admitted (a negative cost).
	outcomeInvalid outcome = "invalid"
)

// record is what the telemetry middlewares learn about one message while it
// is in the stack. It is created by the outermost of [NewTracing]
// and [Metrics.Middleware] and found through the message context. Hooks may
// run on another goroutine (a coalescing policy supersedes a waiting
// message from the goroutine of the newer one), hence the lock.
type record struct {
	topic string

	// spanTrace and spanID identify the consumer span of the tracing
	// middleware that created the record, when it records: that
	// middleware sets the admission's attributes on it as it ends, with
	// the rest, so that recordAdmission leaves it alone. Set before the
	// message enters the chain; zero otherwise (no valid span has a zero
	// ID).
	spanTrace trace.TraceID
	spanID    trace.SpanID

	mu        sync.Mutex
	outcome   outcome
	reason    string
	admission middleware.Admission
	admitted  bool // admission holds a value
}

type recordKey struct{}

// recordContext carries a record. It is context.WithValue folded into the
// record's allocation: one object per message instead of two. Done, Err and
// Deadline are the parent's, so the context package still recognises a
// cancellable parent and derived contexts start no extra goroutine.
type recordContext struct {
	context.Context
	rec record
}

// Value returns the record for recordKey and asks the parent otherwise.
func (c *recordContext) Value(key any) any {
	if _, ok := key.(recordKey); ok {
		return &c.rec
	}
	return c.Context.Value(key)
}

// recordFrom returns the record in ctx, or nil.
func recordFrom(ctx context.Context) *record {
	if !recordsMade.Load() {
		return nil
	}
	r, _ := ctx.Value(recordKey{}).(*record)
	return r
}

// recordsMade is set once the process has made a record (newRecordContext):
// until then no context holds one, and recordFrom does not walk a
// message's context chain to find none. That walk, on the tracing
// middleware's quiet path below no router, was a fifth of the path's
// cost, for every message of an application whose meter and tracer are
// no-ops.
var recordsMade atomic.Bool

// newRecordContext returns parent with a new record for topic.
func newRecordContext(parent context.Context, topic string) *recordContext {
	if !recordsMade.Load() {
		recordsMade.Store(true)
	}
	return &recordContext{Context: parent, rec: record{topic: topic}}
}

// ensureRecord returns the message's record, creating it (and storing it in
// the message context) if no outer telemetry middleware has.
func ensureRecord(msg *message.Message, topic string) *record {
	ctx := msg.Context()
	if r := recordFrom(ctx); r != nil {
		return r
	}
	c := newRecordContext(ctx, topic)
	msg.SetContext(c)
	return &c.rec
}

// ownsSpan reports whether span is the consumer span whose attributes the
// tracing middleware that created r sets as it ends.
func (r *record) ownsSpan(span trace.Span) bool {
	if r == nil || !r.spanID.IsValid() {
		return false
	}
	sc := span.SpanContext()
	return sc.SpanID() == r.spanID && sc.TraceID() == r.spanTrace
}

// own records that span is the tracing middleware's own consumer span.
func (r *record) own(span trace.Span) {
	sc := span.SpanContext()
	r.spanTrace, r.spanID = sc.TraceID(), sc.SpanID()
}

func (r *record) setOutcome(o outcome, reason string) {
	r.mu.Lock()
	r.outcome, r.reason = o, reason
	r.mu.Unlock()
}

// final returns the outcome to report once the chain has returned err.
// An outcome recorded by a hook wins; otherwise the error decides.
func (r *record) final(err error) (outcome, string, middleware.Admission, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.outcome
	if o == "" {
		o = outcomeHandled
		if err != nil {
			o = outcomeError
		}
	}
	return o, r.reason, r.admission, r.admitted
}

// recordOutcome records how msg left the stack: it sets spillway.outcome
// (and spillway.outcome.reason when set) on the message's span and
// remembers the outcome for [Metrics.Middleware], which labels the
// message's duration and throughput with it. Dead-lettering also sets the
// span status to Error. The last outcome recorded wins. Safe to call from
// any goroutine; it never blocks.
func recordOutcome(msg *message.Message, o outcome, reason string) {
	if msg == nil {
		return
	}
	ctx := msg.Context()
	if r := recordFrom(ctx); r != nil {
		r.setOutcome(o, reason)
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(keyOutcome.String(string(o)))
	if reason != "" {
		span.SetAttributes(keyReason.String(reason))
	}
	if o == outcomeDeadLettered {
		span.SetStatus(codes.Error, "dead-lettered")
	}
}

// recordAdmission records a budget admission on msg's span (vertices, cost
// source, wait, admission outcome) and remembers it for
// [Metrics.Middleware]. A cancelled, revoked or invalid admission also sets
// the message's outcome. Safe to call from any goroutine; it never blocks.
func recordAdmission(msg *message.Message, a *middleware.Admission) {
	ctx := msg.Context()
	if r := recordFrom(ctx); r != nil {
		r.setAdmission(a)
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		annotateUnowned(ctx, span, a)
	}
}

// setAdmission stores a in r, and its outcome when it decides the
// message's.
func (r *record) setAdmission(a *middleware.Admission) {
	o, reason := admissionOutcome(a.Result)
	r.mu.Lock()
	r.admission, r.admitted = *a, true
	if o != "" {
		r.outcome, r.reason = o, reason
	}
	r.mu.Unlock()
}

// annotateUnowned sets a's attributes on span, unless span is the tracing
// middleware's own consumer span, which gets them as it ends, in the same
// call as the others.
func annotateUnowned(ctx context.Context, span trace.Span, a *middleware.Admission) {
	if recordFrom(ctx).ownsSpan(span) {
		return
	}
	o, _ := admissionOutcome(a.Result)
	annotateAdmission(span, *a, o)
}

// annotateAdmission sets a's attributes, and the outcome o when set, on
// span.
func annotateAdmission(span trace.Span, a middleware.Admission, o outcome) {
	attrs := appendAdmission(make([]attribute.KeyValue, 0, 7), a)
	if o != "" {
		attrs = append(attrs, keyOutcome.String(string(o)))
	}
	span.SetAttributes(attrs...)
}

// appendAdmission appends the span attributes that describe admission a.
func appendAdmission(attrs []attribute.KeyValue, a middleware.Admission) []attribute.KeyValue {
	if n, ok := knownVertices(a); ok {
		attrs = append(attrs, keyVertices.Int64(n))
	}
	attrs = append(attrs,
		keyCostSource.String(a.Charge.Source.String()),
		keyAdmission.String(string(a.Result)),
		keyAdmissionWait.Float64(a.Wait.Seconds()),
	)
	if a.Result == middleware.Admitted {
		attrs = append(attrs, keyVerticesGranted.Int64(a.Granted), keyAdmissionClamped.Bool(a.Granted < a.Charge.Vertices))
	}
	return attrs
}

func admissionOutcome(o middleware.AdmissionResult) (outcome, string) {
	switch o {
	case middleware.Cancelled:
		return outcomeCancelled, ""
	case middleware.Revoked:
		return outcomeReleased, "revoked"
	case middleware.Invalid:
		return outcomeInvalid, "negative_cost"
	}
	return "", ""
}

// knownVertices returns the message's cost when it is known: counted
// (header or computed) or, failing that, what the budget granted.
func knownVertices(a middleware.Admission) (int64, bool) {
	switch a.Charge.Source {
	case cost.SourceHeader, cost.SourceComputed:
		return a.Charge.Vertices, true
	}
	if a.Result == middleware.Admitted {
		return a.Granted, true
	}
	return 0, false
}

// countedVertices is what spillway.processed.vertices adds for a message
// with a recorded admission: what the budget granted when it was admitted
// (clamped to the capacity, so a forged vertex_count adds at most the
// capacity), else its known cost capped at maxCountedVertices, which no
// budget can exceed.
func countedVertices(a middleware.Admission) (int64, bool) {
	if a.Result == middleware.Admitted {
		return a.Granted, true
	}
	n, ok := knownVertices(a)
	return min(n, maxCountedVertices), ok
}

// maxCountedVertices caps a count taken from the message itself: 2⁴⁰, the
// largest capacity middleware.NewVertexBudget accepts.
const maxCountedVertices = 1 << 40

// headerVertices reads vertex_count when no admission was recorded.
func headerVertices(msg *message.Message) (int64, bool) {
	n, src := cost.ParseCount(msg.Metadata.Get(cost.MetadataKey), len(msg.Payload))
	return n, src == cost.SourceHeader
}
