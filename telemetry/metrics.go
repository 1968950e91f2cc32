package telemetry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	noopmetric "go.opentelemetry.io/otel/metric/noop"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/sizing"
)

// Metric names. docs/operations.md lists them with their Prometheus names
// (the exporter turns dots into underscores and appends unit and _total
// suffixes) and attributes.
const (
	metricBudgetCapacity        = "spillway.budget.capacity"
	metricBudgetInUse           = "spillway.budget.in_use"
	metricBudgetFillRatio       = "spillway.budget.fill_ratio"
	metricBudgetWaiting         = "spillway.budget.waiting"
	metricBudgetWaitingVertices = "spillway.budget.waiting_vertices"
	metricBudgetSaturated       = "spillway.budget.saturated"
	metricBudgetAdmitted        = "spillway.budget.admitted"
	metricBudgetClamped         = "spillway.budget.clamped"
	metricBudgetBound           = "spillway.budget.bound"
	metricBudgetBinding         = "spillway.budget.binding"
	metricBudgetTarget          = "spillway.budget.target"

	metricLaneInUse            = "spillway.budget.lane.in_use"
	metricLaneFillRatio        = "spillway.budget.lane.fill_ratio"
	metricLaneWaiting          = "spillway.budget.lane.waiting"
	metricLaneSaturated        = "spillway.budget.lane.saturated"
	metricLaneWait             = "spillway.budget.lane.wait"
	metricLaneAdmittedVertices = "spillway.budget.lane.admitted_vertices"

	metricAdmissionWait    = "spillway.admission.wait"
	metricAdmissionCharges = "spillway.admission.charges"

	metricProcessDuration    = "spillway.process.duration"
	metricProcessVertices    = "spillway.process.vertices"
	metricProcessedMessages  = "spillway.processed.messages"
	metricProcessedVertices  = "spillway.processed.vertices"
	metricMessagesShed       = "spillway.messages.shed"
	metricMessagesSuperseded = "spillway.messages.superseded"
	metricMessagesDeferred   = "spillway.messages.deferred"
	metricMessagesDeadLetter = "spillway.messages.dead_lettered"
	metricMessagesReleased   = "spillway.messages.released_on_rebalance"

	metricConsumerLag          = "spillway.consumer.lag"
	metricConsumerLagSaturated = "spillway.consumer.lag.saturated"
	metricConsumerLagAge       = "spillway.consumer.lag.sample_age"
	metricConsumerLagErrors    = "spillway.consumer.lag.errors"
)

// Metric attribute keys. They are short on purpose: they become Prometheus
// labels.
const (
	attrTopic     = attribute.Key("topic")
	attrOutcome   = attribute.Key("outcome")
	attrReason    = attribute.Key("reason")
	attrAdmission = attribute.Key("admission")
	attrBudget    = attribute.Key("budget")
	attrLane      = attribute.Key("lane")
	attrBound     = attribute.Key("bound")
	attrGroup     = attribute.Key("group")
	attrPartition = attribute.Key("partition")
	attrSource    = attribute.Key("source")
)

var (
	durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	waitBuckets     = []float64{0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}
	vertexBuckets   = []float64{1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000}
)

// Metrics records Spillway's metrics with the OpenTelemetry metric API.
// Create it with [NewMetrics]. Per-message measurements come from
// [Metrics.Middleware], the hooks [Metrics.OnAdmission], [Metrics.OnShed]
// and [Metrics.OnRetryOutcome] (the router calls them for its stages), and
// [Metrics.OnDeferred] and [Metrics.OnDeadLettered] for stages of your own;
// state (budgets, lag) is read by observable instruments in the SDK's
// collection callback, never per message ([Metrics.ObserveBudget],
// [Metrics.ObserveBounds], [Metrics.ObserveLag]).
//
// A Metrics is safe for concurrent use. Recording never fails and never
// blocks a message; label sets are built once per combination and reused.
// With OpenTelemetry's no-op meter provider nothing is measured per
// message (the no-op meter's [Metrics.Middleware] is the handler itself);
// with its global one, measurements go nowhere until the application
// installs a provider.
type Metrics struct {
	cfg   config
	meter metric.Meter

	// noop: the meter is OpenTelemetry's no-op meter, and nothing is
	// measured.
	noop bool

	duration       metric.Float64Histogram
	vertices       metric.Int64Histogram
	processedMsgs  metric.Int64Counter
	processedVerts metric.Int64Counter
	admissionWait  metric.Float64Histogram
	charges        metric.Int64Counter
	outcomes       map[outcome]metric.Int64Counter

	budgetCapacity     metric.Int64ObservableGauge
	budgetInUse        metric.Int64ObservableGauge
	budgetFill         metric.Float64ObservableGauge
	budgetWaiting      metric.Int64ObservableGauge
	budgetWaitingVerts metric.Int64ObservableGauge
	budgetSaturated    metric.Float64ObservableGauge
	budgetAdmitted     metric.Int64ObservableCounter
	budgetClamped      metric.Int64ObservableCounter
	bound              metric.Int64ObservableGauge
	binding            metric.Int64ObservableGauge
	target             metric.Int64ObservableGauge

	laneInUse     metric.Int64ObservableGauge
	laneFill      metric.Float64ObservableGauge
	laneWaiting   metric.Int64ObservableGauge
	laneSaturated metric.Float64ObservableGauge
	laneWait      metric.Float64ObservableCounter
	laneAdmitted  metric.Int64ObservableCounter

	lag          metric.Int64ObservableGauge
	lagSaturated metric.Float64ObservableGauge
	lagAge       metric.Float64ObservableGauge
	lagErrors    metric.Int64ObservableCounter

	cache attrCache
}

// NewMetrics creates every instrument with the meter of [WithMeterProvider]
// (default: the global provider). It returns an error only if the provider
// refuses an instrument.
func NewMetrics(opts ...Option) (*Metrics, error) {
	cfg := newConfig(opts)
	m := &Metrics{cfg: cfg, meter: meter(cfg.meterProvider)}
	mt := m.meter
	_, m.noop = mt.(noopmetric.Meter)
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error

	m.duration, err = mt.Float64Histogram(metricProcessDuration, metric.WithUnit("s"),
		metric.WithDescription("Time a message spent in the middleware stack, admission wait included, by topic and outcome."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	check(err)
	m.vertices, err = mt.Int64Histogram(metricProcessVertices, metric.WithUnit("{vertex}"),
		metric.WithDescription("Vertices per message, when known, by topic."),
		metric.WithExplicitBucketBoundaries(vertexBuckets...))
	check(err)
	m.processedMsgs, err = mt.Int64Counter(metricProcessedMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Messages that left the middleware stack, by topic and outcome."))
	check(err)
	m.processedVerts, err = mt.Int64Counter(metricProcessedVertices, metric.WithUnit("{vertex}"),
		metric.WithDescription("Vertices of messages that left the middleware stack, by topic and outcome."))
	check(err)
	m.admissionWait, err = mt.Float64Histogram(metricAdmissionWait, metric.WithUnit("s"),
		metric.WithDescription("Time spent waiting for vertex budget, by topic and admission outcome."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	check(err)
	m.charges, err = mt.Int64Counter(metricAdmissionCharges, metric.WithUnit("{message}"),
		metric.WithDescription("Messages admitted by the budget, by topic and where their charge came from (source: header, computed, missing, malformed)."))
	check(err)

	m.outcomes = make(map[outcome]metric.Int64Counter, 5)
	for _, c := range []struct {
		o          outcome
		name, desc string
	}{
		{outcomeShed, metricMessagesShed, "Messages dropped by a shedding policy, by topic and reason."},
		{outcomeSuperseded, metricMessagesSuperseded, "Messages dropped because a newer one for their entity arrived, by topic and reason."},
		{outcomeDeferred, metricMessagesDeferred, "Messages handed back for a later retry, by topic and reason."},
		{outcomeDeadLettered, metricMessagesDeadLetter, "Messages sent to the dead-letter topic, by topic and reason."},
		{outcomeReleased, metricMessagesReleased, "Waiting messages released because their delivery was revoked in a rebalance, by topic and reason."},
	} {
		ctr, err := mt.Int64Counter(c.name, metric.WithUnit("{message}"), metric.WithDescription(c.desc))
		check(err)
		m.outcomes[c.o] = ctr
	}

	m.budgetCapacity, err = mt.Int64ObservableGauge(metricBudgetCapacity, metric.WithUnit("{vertex}"),
		metric.WithDescription("Vertex budget capacity."))
	check(err)
	m.budgetInUse, err = mt.Int64ObservableGauge(metricBudgetInUse, metric.WithUnit("{vertex}"),
		metric.WithDescription("Vertices admitted and not yet released."))
	check(err)
	m.budgetFill, err = mt.Float64ObservableGauge(metricBudgetFillRatio, metric.WithUnit("1"),
		metric.WithDescription("In-use vertices over capacity (0..1)."))
	check(err)
	m.budgetWaiting, err = mt.Int64ObservableGauge(metricBudgetWaiting, metric.WithUnit("{message}"),
		metric.WithDescription("Messages blocked waiting for budget."))
	check(err)
	m.budgetWaitingVerts, err = mt.Int64ObservableGauge(metricBudgetWaitingVertices, metric.WithUnit("{vertex}"),
		metric.WithDescription("Vertices of the messages waiting for budget, each clamped to the capacity."))
	check(err)
	m.budgetSaturated, err = mt.Float64ObservableGauge(metricBudgetSaturated, metric.WithUnit("s"),
		metric.WithDescription("How long the budget has been saturated without a break; 0 when it is not."))
	check(err)
	m.budgetAdmitted, err = mt.Int64ObservableCounter(metricBudgetAdmitted, metric.WithUnit("{message}"),
		metric.WithDescription("Charges admitted by the budget."))
	check(err)
	m.budgetClamped, err = mt.Int64ObservableCounter(metricBudgetClamped, metric.WithUnit("{message}"),
		metric.WithDescription("Admitted charges that exceeded the capacity and were clamped to it."))
	check(err)
	m.bound, err = mt.Int64ObservableGauge(metricBudgetBound, metric.WithUnit("{vertex}"),
		metric.WithDescription("Budget bounds computed by auto-sizing, by bound (memory, deadline)."))
	check(err)
	m.binding, err = mt.Int64ObservableGauge(metricBudgetBinding,
		metric.WithDescription("1 for the bound that currently sets the budget, 0 for the others."))
	check(err)
	m.target, err = mt.Int64ObservableGauge(metricBudgetTarget, metric.WithUnit("{vertex}"),
		metric.WithDescription("The budget auto-sizing asks for."))
	check(err)

	m.laneInUse, err = mt.Int64ObservableGauge(metricLaneInUse, metric.WithUnit("{vertex}"),
		metric.WithDescription("Vertices a budget lane holds, by lane."))
	check(err)
	m.laneFill, err = mt.Float64ObservableGauge(metricLaneFillRatio, metric.WithUnit("1"),
		metric.WithDescription("A lane's in-use vertices over the budget's capacity (0..1), by lane."))
	check(err)
	m.laneWaiting, err = mt.Int64ObservableGauge(metricLaneWaiting, metric.WithUnit("{message}"),
		metric.WithDescription("Messages of a lane blocked waiting for budget, by lane."))
	check(err)
	m.laneSaturated, err = mt.Float64ObservableGauge(metricLaneSaturated, metric.WithUnit("s"),
		metric.WithDescription("How long a lane's next charge has had to wait without a break; 0 when it would not, by lane."))
	check(err)
	m.laneWait, err = mt.Float64ObservableCounter(metricLaneWait, metric.WithUnit("s"),
		metric.WithDescription("Time the admitted charges of a lane spent waiting for budget, summed, by lane."))
	check(err)
	m.laneAdmitted, err = mt.Int64ObservableCounter(metricLaneAdmittedVertices, metric.WithUnit("{vertex}"),
		metric.WithDescription("Vertices admitted in a lane, after clamping, by lane."))
	check(err)

	m.lag, err = mt.Int64ObservableGauge(metricConsumerLag, metric.WithUnit("{message}"),
		metric.WithDescription("Consumer lag from the latest background sample, by topic (or stream), group and partition."))
	check(err)
	m.lagSaturated, err = mt.Float64ObservableGauge(metricConsumerLagSaturated, metric.WithUnit("s"),
		metric.WithDescription("How long total lag has been above the sampler's threshold; 0 when it is not."))
	check(err)
	m.lagAge, err = mt.Float64ObservableGauge(metricConsumerLagAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the latest successful lag sample."))
	check(err)
	m.lagErrors, err = mt.Int64ObservableCounter(metricConsumerLagErrors, metric.WithUnit("{sample}"),
		metric.WithDescription("Lag samples that failed."))
	check(err)

	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return m, nil
}

// attrKey identifies a cached attribute set.
type attrKey struct {
	shape uint8 // which of the fields below are labels
	topic string
	value string
}

const (
	shapeTopic uint8 = iota
	shapeOutcome
	shapeAdmission
	shapeReason
	shapeSource
)

// measureOpts are the ready-made options of one label combination, kept as
// slices so that passing them with ... allocates nothing.
type measureOpts struct {
	rec []metric.RecordOption
	add []metric.AddOption
}

// attrCache is a copy-on-write map: readers load it atomically without
// locking or allocating; a writer copies it to add a combination. Label
// values are few (topics times a fixed set of outcomes and reasons), so it
// stays small and stops changing once warm.
type attrCache struct {
	m  atomic.Pointer[map[attrKey]*measureOpts]
	mu sync.Mutex
}

func (c *attrCache) get(k attrKey) *measureOpts {
	if m := c.m.Load(); m != nil {
		if o, ok := (*m)[k]; ok {
			return o
		}
	}
	return c.insert(k)
}

// insert is the slow path of get.
func (c *attrCache) insert(k attrKey) *measureOpts {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if o, ok := (*old)[k]; ok {
			return o
		}
	}
	var set attribute.Set
	switch k.shape {
	case shapeTopic:
		set = attribute.NewSet(attrTopic.String(k.topic))
	case shapeOutcome:
		set = attribute.NewSet(attrTopic.String(k.topic), attrOutcome.String(k.value))
	case shapeAdmission:
		set = attribute.NewSet(attrTopic.String(k.topic), attrAdmission.String(k.value))
	case shapeReason:
		set = attribute.NewSet(attrTopic.String(k.topic), attrReason.String(k.value))
	case shapeSource:
		set = attribute.NewSet(attrTopic.String(k.topic), attrSource.String(k.value))
	}
	opt := metric.WithAttributeSet(set)
	o := &measureOpts{rec: []metric.RecordOption{opt}, add: []metric.AddOption{opt}}
	next := make(map[attrKey]*measureOpts, 1)
	if old != nil {
		next = make(map[attrKey]*measureOpts, len(*old)+1)
		for kk, vv := range *old {
			next[kk] = vv
		}
	}
	next[k] = o
	c.m.Store(&next)
	return o
}

// attrs returns the measurement options for a label combination.
func (m *Metrics) attrs(shape uint8, topic, value string) *measureOpts {
	return m.cache.get(attrKey{shape, topic, value})
}

// Middleware measures each message: spillway.process.duration,
// spillway.processed.messages and, when the message's vertex count is known,
// spillway.processed.vertices and spillway.process.vertices. The outcome
// label is the one recorded by a hook ([Metrics.OnShed],
// [Metrics.OnDeferred], [Metrics.OnDeadLettered], a cancelled or revoked
// admission), else
// "handled" or "error" from the chain's result, or "panic" (the panic is
// not recovered). The vertex count comes from the admission recorded by
// [Metrics.OnAdmission] (for an admitted message the charge the budget
// granted, clamped to its capacity), else from the vertex_count metadata;
// a count from the message itself is capped at 2⁴⁰ (the largest budget
// capacity), so a forged vertex_count cannot overflow the counter.
//
// Place it right inside [NewTracing] (or outermost without
// tracing) so the duration covers the whole stack. It never returns an
// error of its own and never alters the chain's result.
func (m *Metrics) Middleware(h message.HandlerFunc) message.HandlerFunc {
	if m.noop {
		// OpenTelemetry's no-op meter: nothing to measure, ever.
		return h
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		return m.measure(h, msg)
	}
}

// measure runs h and measures msg; see [Metrics.Middleware].
func (m *Metrics) measure(h message.HandlerFunc, msg *message.Message) (out []*message.Message, err error) {
	rec := recordFrom(msg.Context())
	if rec == nil {
		rec = ensureRecord(msg, m.cfg.topicOf(msg))
	}
	topic := rec.topic
	ctx := msg.Context()
	start := time.Now()
	returned := false
	defer func() {
		o, _, adm, hasAdm := rec.final(err)
		if !returned {
			o = outcomePanic
		}
		opt := m.attrs(shapeOutcome, topic, string(o))
		m.duration.Record(ctx, time.Since(start).Seconds(), opt.rec...)
		m.processedMsgs.Add(ctx, 1, opt.add...)
		var n int64
		var known bool
		if hasAdm {
			n, known = countedVertices(adm)
		} else {
			n, known = headerVertices(msg)
			n = min(n, maxCountedVertices)
		}
		if known {
			m.processedVerts.Add(ctx, n, opt.add...)
			m.vertices.Record(ctx, n, m.attrs(shapeTopic, topic, "").rec...)
		}
	}()
	out, err = h(msg)
	returned = true
	return out, err
}

// OnAdmission records a budget admission: the spillway.admission.wait
// histogram (by topic and admission outcome); for an admitted message,
// spillway.admission.charges by topic and the charge's source (header,
// computed, missing, malformed: cost.Source), so that messages charged a
// default cost for want of a vertex_count can be counted and alerted on;
// and, for a revoked admission, spillway.messages.released_on_rebalance
// (reason "revoked"). It also records the admission on the message's
// span (spillway.vertices, spillway.cost.source,
// spillway.admission.outcome, .wait_seconds, and for an admitted message
// spillway.vertices.granted and spillway.admission.clamped) and, for a
// cancelled, revoked or invalid admission, the message's outcome. Use it as
// middleware.WithOnAdmission; for the span attributes without
// metrics, make the Metrics with a no-op meter provider. Safe for
// concurrent use; it never blocks.
func (m *Metrics) OnAdmission(msg *message.Message, a middleware.Admission) {
	if msg == nil {
		return
	}
	recordAdmission(msg, &a)
	if !m.noop {
		m.admission(msg, &a)
	}
}

// admission measures a; see [Metrics.OnAdmission].
func (m *Metrics) admission(msg *message.Message, a *middleware.Admission) {
	ctx := msg.Context()
	topic := m.topicOf(msg)
	m.admissionWait.Record(ctx, a.Wait.Seconds(), m.attrs(shapeAdmission, topic, string(a.Result)).rec...)
	switch a.Result {
	case middleware.Admitted:
		m.charges.Add(ctx, 1, m.attrs(shapeSource, topic, a.Charge.Source.String()).add...)
	case middleware.Revoked:
		m.outcomes[outcomeReleased].Add(ctx, 1, m.attrs(shapeReason, topic, "revoked").add...)
	}
}

// OnShed records a message dropped by a shedding policy: it counts
// spillway.messages.shed (spillway.messages.superseded for
// reason "superseded") by topic and reason, sets spillway.outcome and
// spillway.outcome.reason on the message's span, and labels the message's
// duration and throughput with the outcome ([Metrics.Middleware]). An empty
// topic is taken from the message. Use it as the policy's hook
// (shedding.WithOnShed(m.OnShed)); it is the router's shedding hook too.
// Safe for concurrent use; it never blocks.
func (m *Metrics) OnShed(msg *message.Message, topic, reason string) {
	o := outcomeShed
	if reason == "superseded" {
		o = outcomeSuperseded
	}
	m.record(msg, o, topic, reason)
}

// OnDeferred records a message a stage of your own handed back for a later
// retry, the way [Metrics.OnShed] records a shed one: it counts
// spillway.messages.deferred by topic and reason and records the outcome
// "deferred" on the message. An empty topic is taken from the message.
// The retry gate's deferrals are counted by [Metrics.OnRetryOutcome]
// instead. Safe for concurrent use; it never blocks.
func (m *Metrics) OnDeferred(msg *message.Message, topic, reason string) {
	m.record(msg, outcomeDeferred, topic, reason)
}

// OnDeadLettered records a message a stage of your own sent to a
// dead-letter topic, the way [Metrics.OnShed] records a shed one: it counts
// spillway.messages.dead_lettered by topic and reason, records the outcome
// "dead_lettered" on the message and sets its span's status to Error. An
// empty topic is taken from the message. The retry gate's dead letters are
// counted by [Metrics.OnRetryOutcome] instead. Safe for concurrent use; it
// never blocks.
func (m *Metrics) OnDeadLettered(msg *message.Message, topic, reason string) {
	m.record(msg, outcomeDeadLettered, topic, reason)
}

// OnRetryOutcome counts a delivery that the retry gate deferred
// (spillway.messages.deferred) or dead-lettered
// (spillway.messages.dead_lettered), by topic and cause; other outcomes are
// not counted here. It counts only: the message's outcome label and span
// are left as they are. Pass it to retrygate.WithOnOutcome; it is the
// router's retry hook too. Safe for concurrent use; it never blocks.
func (m *Metrics) OnRetryOutcome(e retrygate.Event) {
	var o outcome
	switch e.Outcome {
	case retrygate.Deferred:
		o = outcomeDeferred
	case retrygate.DeadLettered:
		o = outcomeDeadLettered
	default:
		return
	}
	ctx := context.Background()
	if e.Message != nil {
		ctx = e.Message.Context()
	}
	m.count(ctx, o, e.Topic, e.Cause, 1)
}

// count adds n to the counter of o (spillway.messages.shed,
// .superseded, .deferred, .dead_lettered or .released_on_rebalance) with
// the given topic and reason labels. Outcomes without a counter (handled,
// error, ...) are ignored. Safe for concurrent use.
func (m *Metrics) count(ctx context.Context, o outcome, topic, reason string, n int64) {
	c, ok := m.outcomes[o]
	if !ok || n == 0 || m.noop {
		return
	}
	if ctx == nil {
		ctx = context.Background()
	}
	c.Add(ctx, n, m.attrs(shapeReason, topic, reason).add...)
}

// record counts one message for o and records o on the message: the
// hooks' common part.
func (m *Metrics) record(msg *message.Message, o outcome, topic, reason string) {
	if msg == nil {
		return
	}
	if topic == "" {
		topic = m.topicOf(msg)
	}
	m.count(msg.Context(), o, topic, reason, 1)
	recordOutcome(msg, o, reason)
}

func (m *Metrics) topicOf(msg *message.Message) string {
	if r := recordFrom(msg.Context()); r != nil {
		return r.topic
	}
	return m.cfg.topicOf(msg)
}

// ObserveBudget exports b's state under the label budget=name:
// spillway.budget.capacity, .in_use, .fill_ratio, .waiting,
// .waiting_vertices, .saturated (seconds), .admitted and .clamped; and,
// for a budget split into lanes (middleware.WithLanes), per lane under the
// labels budget=name and lane: spillway.budget.lane.in_use, .fill_ratio,
// .waiting, .saturated (seconds), .wait (seconds waited, summed) and
// .admitted_vertices. The values are read with one b.Stats() (and
// b.SaturatedFor(), b.Lanes()) per collection, never per message.
// Names must be unique per Metrics. Call unregister to stop exporting.
func (m *Metrics) ObserveBudget(name string, b *middleware.VertexBudget) (unregister func() error, err error) {
	if b == nil {
		return nil, errors.New("telemetry: ObserveBudget: nil budget")
	}
	opt := metric.WithAttributeSet(attribute.NewSet(attrBudget.String(name)))
	var laneOpts []metric.ObserveOption
	if ls := b.Lanes(); len(ls) > 1 {
		for _, l := range ls {
			laneOpts = append(laneOpts, metric.WithAttributeSet(attribute.NewSet(attrBudget.String(name), attrLane.String(l.Name))))
		}
	}
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := b.Stats()
		fill := 0.0
		if s.Capacity > 0 {
			fill = float64(s.InUse) / float64(s.Capacity)
		}
		o.ObserveInt64(m.budgetCapacity, s.Capacity, opt)
		o.ObserveInt64(m.budgetInUse, s.InUse, opt)
		o.ObserveFloat64(m.budgetFill, fill, opt)
		o.ObserveInt64(m.budgetWaiting, int64(s.Waiting), opt)
		o.ObserveInt64(m.budgetWaitingVerts, s.WaitingVertices, opt)
		o.ObserveFloat64(m.budgetSaturated, b.SaturatedFor().Seconds(), opt)
		o.ObserveInt64(m.budgetAdmitted, int64(s.Admitted), opt)
		o.ObserveInt64(m.budgetClamped, int64(s.Clamped), opt)
		if laneOpts != nil {
			for i, l := range b.Lanes() {
				lf := 0.0
				if s.Capacity > 0 {
					lf = float64(l.InUse) / float64(s.Capacity)
				}
				o.ObserveInt64(m.laneInUse, l.InUse, laneOpts[i])
				o.ObserveFloat64(m.laneFill, lf, laneOpts[i])
				o.ObserveInt64(m.laneWaiting, int64(l.Waiting), laneOpts[i])
				o.ObserveFloat64(m.laneSaturated, l.SaturatedFor.Seconds(), laneOpts[i])
				o.ObserveFloat64(m.laneWait, l.TotalWait.Seconds(), laneOpts[i])
				o.ObserveInt64(m.laneAdmitted, int64(l.AdmittedVertices), laneOpts[i])
			}
		}
		return nil
	}, m.budgetCapacity, m.budgetInUse, m.budgetFill, m.budgetWaiting, m.budgetWaitingVerts,
		m.budgetSaturated, m.budgetAdmitted, m.budgetClamped,
		m.laneInUse, m.laneFill, m.laneWaiting, m.laneSaturated, m.laneWait, m.laneAdmitted)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}

// ObserveBounds exports what budget auto-sizing computed, under the label
// budget=name: spillway.budget.bound{bound="memory"|"deadline"|"tail"}
// (bounds that are not positive are skipped), spillway.budget.target (the
// sizer's Budget), and spillway.budget.binding, which is 1 for the binding
// bound and 0 for the others. Pass the auto-sizer's Bounds method
// (m.ObserveBounds("geo", sizer.Bounds)); f is called once per collection
// from the SDK's collection goroutine, so it must be fast and safe for
// concurrent use.
func (m *Metrics) ObserveBounds(name string, f func() sizing.Bounds) (unregister func() error, err error) {
	if f == nil {
		return nil, errors.New("telemetry: ObserveBounds: nil func")
	}
	budget := attrBudget.String(name)
	memory := metric.WithAttributeSet(attribute.NewSet(budget, attrBound.String("memory")))
	deadline := metric.WithAttributeSet(attribute.NewSet(budget, attrBound.String("deadline")))
	tail := metric.WithAttributeSet(attribute.NewSet(budget, attrBound.String("tail")))
	plain := metric.WithAttributeSet(attribute.NewSet(budget))
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		b := f()
		if b.MemoryBound > 0 {
			o.ObserveInt64(m.bound, b.MemoryBound, memory)
		}
		if b.DeadlineBound > 0 {
			o.ObserveInt64(m.bound, b.DeadlineBound, deadline)
		}
		if b.TailBound > 0 {
			o.ObserveInt64(m.bound, b.TailBound, tail)
		}
		if b.Budget > 0 {
			o.ObserveInt64(m.target, b.Budget, plain)
		}
		isBinding := func(name string) int64 {
			if b.Binding == name {
				return 1
			}
			return 0
		}
		o.ObserveInt64(m.binding, isBinding("memory"), memory)
		o.ObserveInt64(m.binding, isBinding("deadline"), deadline)
		o.ObserveInt64(m.binding, isBinding("tail"), tail)
		if b.Binding != "" && b.Binding != "memory" && b.Binding != "deadline" && b.Binding != "tail" {
			o.ObserveInt64(m.binding, 1, metric.WithAttributes(budget, attrBound.String(b.Binding)))
		}
		return nil
	}, m.bound, m.binding, m.target)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}

// ObserveLag exports the latest samples of s: spillway.consumer.lag by
// topic, group and partition (partition only for sources that have
// partitions), and, under the label source=name,
// spillway.consumer.lag.saturated (seconds), .sample_age (seconds) and
// .errors. It reads the sampler's cache; it never queries the broker. A
// sampler whose samples have gone stale (see [LagSampler]) exports no lag
// series until it samples again.
func (m *Metrics) ObserveLag(name string, s *LagSampler) (unregister func() error, err error) {
	if s == nil {
		return nil, errors.New("telemetry: ObserveLag: nil sampler")
	}
	src := metric.WithAttributeSet(attribute.NewSet(attrSource.String(name)))
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.stats()
		for _, smp := range s.latest() {
			o.ObserveInt64(m.lag, smp.Lag, metric.WithAttributeSet(smp.attributes()))
		}
		o.ObserveFloat64(m.lagSaturated, st.SaturatedFor.Seconds(), src)
		if !st.LastSuccess.IsZero() {
			o.ObserveFloat64(m.lagAge, time.Since(st.LastSuccess).Seconds(), src)
		}
		o.ObserveInt64(m.lagErrors, int64(st.Errors), src)
		return nil
	}, m.lag, m.lagSaturated, m.lagAge, m.lagErrors)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}
