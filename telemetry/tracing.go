package telemetry

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// tracing is the consumer side of Spillway's tracing: the middleware
// [NewTracing] returns. It is immutable.
type tracing struct {
	cfg    config
	tracer trace.Tracer
	fields []string // the metadata keys the propagator reads
	starts startCache
	// noop is set when tracer is OpenTelemetry's no-op tracer.
	noop bool
}

// startless reports whether a span need not be started for a message
// whose context is parent: the tracer is OpenTelemetry's no-op tracer and
// parent's span does not record (that tracer would return parent's span,
// or a no-op span, in a new context). Starting one would only allocate a
// non-recording span.
func (t *tracing) startless(parent context.Context) bool {
	return t.noop && !trace.SpanFromContext(parent).IsRecording()
}

// isNoopTracer reports whether tr is OpenTelemetry's no-op tracer (package
// trace/noop), whose spans never record.
func isNoopTracer(tr trace.Tracer) bool {
	_, ok := tr.(tracenoop.Tracer)
	return ok
}

// NewTracing returns the consumer side of Spillway's tracing: a Watermill
// middleware that continues the producer's trace and wraps each message in
// a consumer span. Relevant options: [WithTracerProvider],
// [WithPropagator], [WithLinkToProducer], [WithMessagingSystem], [WithConsumerGroup],
// [WithAttributes], [WithTopicFunc]. The middleware is safe for concurrent
// use and may wrap any number of handlers.
//
// It must be the outermost Spillway middleware, so the span covers the
// whole stack, including time spent waiting for budget. For each message it
// extracts the trace context from the metadata with the propagator, starts
// a span named "process <topic>" of kind Consumer as a child of the
// extracted context (so the producer's span is its parent; with
// [WithLinkToProducer], a new trace linked to it instead), and stores the
// span in the message's context (msg.SetContext) where inner stages and the
// handler find it with trace.SpanFromContext(msg.Context()), and where the
// hooks of [Metrics] record what the stages did. Messages the handler produces with that context become
// children of the consumer span when published through a publisher of
// [NewTracingPublisher].
//
// The span carries messaging.system, messaging.operation.type "process",
// messaging.operation.name, messaging.destination.name,
// messaging.message.id, messaging.message.body.size,
// messaging.consumer.group.name (when set), spillway.retry.attempt (when
// the metadata has one), the attributes of [WithAttributes], and what the
// Spillway stages record. An error from the chain is recorded on the span
// and sets its status to Error; a panic does too and is then re-raised
// unchanged. The middleware never returns an error of its own and never
// alters the chain's result.
func NewTracing(opts ...Option) message.HandlerMiddleware {
	return newTracing(opts...).middleware
}

func newTracing(opts ...Option) *tracing {
	cfg := newConfig(opts)
	tr := tracer(cfg.tracerProvider)
	return &tracing{cfg: cfg, tracer: tr, fields: cfg.propagator.Fields(), noop: isNoopTracer(tr)}
}

// carriesContext reports whether msg has any of the propagator's fields:
// without one there is nothing to extract, and the propagator is skipped.
// A propagator that names no fields (OpenTelemetry's global one before the
// application installs a propagator) is always asked.
func (t *tracing) carriesContext(msg *message.Message) bool {
	if len(t.fields) == 0 {
		return true
	}
	if len(msg.Metadata) == 0 {
		return false
	}
	for _, f := range t.fields {
		if _, ok := msg.Metadata[f]; ok {
			return true
		}
	}
	return false
}

// middleware wraps h in a consumer span.
func (t *tracing) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if t.startless(msg.Context()) {
			t.carryProducer(msg)
			return h(msg)
		}
		return t.traced(h, msg)
	}
}

// carryProducer is the middleware's work when no span is started (see
// startless): the producer's span context, when the message carries one,
// goes into the message's context, for the handler and for propagation,
// as the no-op tracer's span would carry it. No record is made: the
// metrics middleware makes its own when it measures.
func (t *tracing) carryProducer(msg *message.Message) {
	if t.cfg.linkProducer || !t.carriesContext(msg) {
		return
	}
	msg.SetContext(t.cfg.propagator.Extract(msg.Context(), metadataCarrier{msg}))
}

// traced runs h with msg in a consumer span.
func (t *tracing) traced(h message.HandlerFunc, msg *message.Message) (out []*message.Message, err error) {
	var cs consumerSpan
	t.begin(msg, &cs)
	returned := false
	defer func() {
		if !returned {
			// A panic, or runtime.Goexit (recover returns nil then).
			v := recover()
			cs.abort(v)
			if v != nil {
				panic(v)
			}
			return
		}
		cs.finish(err)
	}()
	out, err = h(msg)
	returned = true
	return out, err
}

// consumerSpan is what the tracing middleware keeps of a message while the
// chain runs.
type consumerSpan struct {
	span trace.Span
	rec  *record
	// buf holds attrs, the per-message attributes read as the span
	// started, set as it ends with the admission and the outcome, in one
	// call: every call grows the span's attribute slice. nil when the span
	// does not record.
	buf   *attrBuf
	attrs []attribute.KeyValue
	// owned: the middleware made the record, and the admission's
	// attributes are its to set (see recordAdmission).
	owned bool
}

// begin starts msg's consumer span and puts it, with the record, into the
// message's context.
func (t *tracing) begin(msg *message.Message, cs *consumerSpan) {
	topic := t.cfg.topicOf(msg)
	st := t.starts.get(topic, t.newStart)
	parent, opts := msg.Context(), st.opts
	// The message's record, made here unless an outer telemetry
	// middleware made it.
	var rc *recordContext
	rec := recordFrom(parent)
	if rec == nil {
		rc = newRecordContext(parent, topic)
		rec, parent = &rc.rec, rc
	}
	if t.carriesContext(msg) {
		remote := t.cfg.propagator.Extract(parent, metadataCarrier{msg})
		if !t.cfg.linkProducer {
			parent = remote
		} else if sc := trace.SpanContextFromContext(remote); sc.IsValid() {
			opts = append(slices.Clip(opts), trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	ctx, span := t.tracer.Start(parent, st.name, opts...)
	cs.span, cs.rec = span, rec
	if span.IsRecording() {
		cs.buf = getAttrBuf()
		cs.attrs = t.appendMessageAttributes(cs.buf.s, msg)
		if rc != nil {
			rec.own(span)
			cs.owned = true
		}
	}
	msg.SetContext(ctx)
}

// finish ends the span once the chain has returned err.
func (cs *consumerSpan) finish(err error) {
	if cs.buf == nil {
		cs.span.End()
		return
	}
	if err != nil {
		cs.span.RecordError(err)
		cs.span.SetStatus(codes.Error, err.Error())
		cs.attrs = append(cs.attrs, semconv.ErrorType(err))
	}
	o, _, _, _ := cs.rec.final(err)
	endSpan(cs.span, cs.rec, cs.owned, cs.buf, cs.attrs, o)
}

// abort ends the span when the chain panicked with v, or its goroutine
// exited (v nil).
func (cs *consumerSpan) abort(v any) {
	if v == nil {
		cs.span.SetStatus(codes.Error, "handler goroutine exited")
		endSpan(cs.span, cs.rec, cs.owned, cs.buf, cs.attrs, "")
		return
	}
	cs.span.SetStatus(codes.Error, fmt.Sprintf("panic: %v", v))
	endSpan(cs.span, cs.rec, cs.owned, cs.buf, cs.attrs, outcomePanic)
}

// endSpan sets attrs on a recording consumer span, with the admission's
// attributes when the middleware owns the span (owned: recordAdmission
// left them to it) and spillway.outcome o (when set), in one call, ends
// the span and returns buf, which attrs was appended to, to its pool.
func endSpan(span trace.Span, rec *record, owned bool, buf *attrBuf, attrs []attribute.KeyValue, o outcome) {
	if !span.IsRecording() {
		// Ended already (by a stage that should not have): nothing to set.
		span.End()
		if buf != nil {
			putAttrBuf(buf, attrs)
		}
		return
	}
	if owned {
		if _, _, a, ok := rec.final(nil); ok {
			attrs = appendAdmission(attrs, a)
			if ao, _ := admissionOutcome(a.Result); ao != "" && o == "" {
				o = ao
			}
		}
	}
	if o != "" {
		attrs = append(attrs, keyOutcome.String(string(o)))
	}
	span.SetAttributes(attrs...)
	span.End()
	if buf != nil {
		putAttrBuf(buf, attrs)
	}
}

// spanStart is what every consumer span of one topic starts with: its name,
// kind and the attributes samplers may look at.
type spanStart struct {
	name string
	opts []trace.SpanStartOption
}

func (t *tracing) newStart(topic string) *spanStart {
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(t.cfg.system),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(topic),
	}
	if t.cfg.consumerGroup != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(t.cfg.consumerGroup))
	}
	return &spanStart{
		name: "process " + topic,
		opts: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)},
	}
}

// appendMessageAttributes appends the per-message attributes, added only
// to spans that record.
func (t *tracing) appendMessageAttributes(attrs []attribute.KeyValue, msg *message.Message) []attribute.KeyValue {
	attrs = append(attrs,
		semconv.MessagingMessageID(msg.UUID),
		semconv.MessagingMessageBodySize(len(msg.Payload)),
	)
	if v := msg.Metadata.Get(attemptKey); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			attrs = append(attrs, keyAttempt.Int64(n))
		}
	}
	if t.cfg.attributes != nil {
		attrs = append(attrs, t.cfg.attributes(msg)...)
	}
	return attrs
}

// startCache maps a topic to its span start, copy-on-write: lookups are an
// atomic load and a map read, without locks or allocation.
type startCache struct {
	m  atomic.Pointer[map[string]*spanStart]
	mu sync.Mutex
}

func (c *startCache) get(topic string, build func(string) *spanStart) *spanStart {
	if m := c.m.Load(); m != nil {
		if s, ok := (*m)[topic]; ok {
			return s
		}
	}
	return c.insert(topic, build)
}

func (c *startCache) insert(topic string, build func(string) *spanStart) *spanStart {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if s, ok := (*old)[topic]; ok {
			return s
		}
	}
	s := build(topic)
	next := make(map[string]*spanStart, 1)
	if old != nil {
		next = make(map[string]*spanStart, len(*old)+1)
		for k, v := range *old {
			next[k] = v
		}
	}
	next[topic] = s
	c.m.Store(&next)
	return s
}

// tracingPublisher is the publisher [NewTracingPublisher] returns. It is
// immutable.
type tracingPublisher struct {
	pub    message.Publisher
	cfg    config
	tracer trace.Tracer
	starts startCache
	noop   bool // tracer is OpenTelemetry's no-op tracer
}

// NewTracingPublisher returns the producer side of Spillway's tracing: pub
// decorated so that it writes each message's trace context into its
// metadata, and the consumer span continues the trace across the broker.
// Relevant options: [WithTracerProvider], [WithPropagator],
// [WithMessagingSystem], [WithAttributes], [WithProducerSpans]. It panics
// if pub is nil.
//
// Publish starts a producer span "send <topic>" per message, as a child of
// the span in msg.Context(), injects the span's context into the message's
// metadata, and publishes all messages with one call to pub. Each span ends
// when that call returns, with the publish error (if any) as its status,
// and carries the message's vertex count when the metadata has one by then
// (so a stamping publisher may sit inside this one). With
// WithProducerSpans(false) it only injects the context already in
// msg.Context(). Tracing never causes Publish to fail: the error is pub's.
// Close closes pub.
//
// The publisher is safe for concurrent use if pub is. Publish writes to the
// metadata of the messages it is given, so a message must not be published
// from two goroutines at once (Watermill requires that anyway).
func NewTracingPublisher(pub message.Publisher, opts ...Option) message.Publisher {
	if pub == nil {
		panic("telemetry: NewTracingPublisher: nil publisher")
	}
	cfg := newConfig(opts)
	tr := tracer(cfg.tracerProvider)
	return &tracingPublisher{pub: pub, cfg: cfg, tracer: tr, noop: isNoopTracer(tr)}
}

// Publish traces and publishes messages; see [NewTracingPublisher].
func (p *tracingPublisher) Publish(topic string, messages ...*message.Message) error {
	if !p.cfg.producerSpans || p.noop && !anyRecording(messages) {
		// Without producer spans, or with the no-op tracer, whose span
		// would be the one in msg.Context() (or none) in a new context:
		// inject msg.Context() as it is.
		for _, msg := range messages {
			if msg != nil {
				p.cfg.propagator.Inject(msg.Context(), metadataCarrier{msg})
			}
		}
		return p.pub.Publish(topic, messages...)
	}

	var one [1]trace.Span
	spans := one[:0]
	if len(messages) > 1 {
		spans = make([]trace.Span, 0, len(messages))
	}
	st := p.starts.get(topic, p.newStart)
	for _, msg := range messages {
		if msg == nil {
			spans = append(spans, nil)
			continue
		}
		ctx, span := p.tracer.Start(msg.Context(), st.name, st.opts...)
		p.cfg.propagator.Inject(ctx, metadataCarrier{msg})
		spans = append(spans, span)
	}

	err := p.pub.Publish(topic, messages...)

	for i, span := range spans {
		if span == nil {
			continue
		}
		if span.IsRecording() {
			// Every per-message attribute in one call: each call grows
			// the span's attribute slice.
			buf := getAttrBuf()
			attrs := p.appendMessageAttributes(buf.s, messages[i], len(messages))
			if n, ok := headerVertices(messages[i]); ok {
				attrs = append(attrs, keyVertices.Int64(n))
			}
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
				attrs = append(attrs, semconv.ErrorType(err))
			}
			span.SetAttributes(attrs...)
			putAttrBuf(buf, attrs)
		}
		span.End()
	}
	return err
}

func (p *tracingPublisher) newStart(topic string) *spanStart {
	return &spanStart{
		name: "send " + topic,
		opts: []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				semconv.MessagingSystemKey.String(p.cfg.system),
				semconv.MessagingOperationTypeSend,
				semconv.MessagingOperationName("send"),
				semconv.MessagingDestinationName(topic),
			),
		},
	}
}

// anyRecording reports whether the context of any of messages carries a
// recording span.
func anyRecording(messages []*message.Message) bool {
	for _, msg := range messages {
		if msg != nil && trace.SpanFromContext(msg.Context()).IsRecording() {
			return true
		}
	}
	return false
}

// appendMessageAttributes appends the per-message attributes of a
// producer span.
func (p *tracingPublisher) appendMessageAttributes(attrs []attribute.KeyValue, msg *message.Message, batch int) []attribute.KeyValue {
	attrs = append(attrs,
		semconv.MessagingMessageID(msg.UUID),
		semconv.MessagingMessageBodySize(len(msg.Payload)),
	)
	if batch > 1 {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(batch))
	}
	if p.cfg.attributes != nil {
		attrs = append(attrs, p.cfg.attributes(msg)...)
	}
	return attrs
}

// Close closes the wrapped publisher.
func (p *tracingPublisher) Close() error { return p.pub.Close() }

// attrBuf is a reusable slice for the attributes a span gets in one
// SetAttributes call as it ends. Spans copy what they are given (the SDK
// appends the values to a slice of its own), so the buffer goes back to
// the pool once the call has returned.
type attrBuf struct{ s []attribute.KeyValue }

var attrBufs = sync.Pool{New: func() any { return &attrBuf{s: make([]attribute.KeyValue, 0, 16)} }}

func getAttrBuf() *attrBuf { return attrBufs.Get().(*attrBuf) }

// putAttrBuf returns b, holding s (b.s or what appending to it made), to
// the pool; oversized slices are left to the collector.
func putAttrBuf(b *attrBuf, s []attribute.KeyValue) {
	if cap(s) > 64 {
		return
	}
	clear(s)
	b.s = s[:0]
	attrBufs.Put(b)
}
