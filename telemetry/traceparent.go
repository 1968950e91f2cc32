package telemetry

import (
	"context"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// The W3C trace context metadata keys, as propagation.TraceContext writes
// them.
const (
	traceparentKey = "traceparent"
	tracestateKey  = "tracestate"
)

// spanKey returns the context key under which OpenTelemetry's trace
// package keeps the current span, learnt once, as the package is
// initialised, by asking trace.SpanFromContext to look a span up in a
// context that remembers the key it is asked for. With it a recordContext
// can carry the producer's span context itself, in the allocation it makes
// anyway, instead of the propagator wrapping the context twice (a span
// value and a context value). nil if the lookup did not go through Value,
// and then the propagator is always used.
//
// A variable read, not a sync.OnceValue: it is compared on every context
// lookup that passes a recordContext or a quietContext, some deep on the
// message goroutine's stack, where the once-function's two frames made the
// deepest path of the whole stack (internal/stackprobe).
func spanKey() any { return otelSpanKey }

var otelSpanKey = func() any {
	var p keyProbe
	trace.SpanFromContext(&p)
	return p.key
}()

// keyProbe is a context that records the first key it is asked for.
type keyProbe struct {
	context.Context
	key any
}

func (p *keyProbe) Value(key any) any {
	if p.key == nil {
		p.key = key
	}
	return nil
}

// remoteSpan is the producer's span as the consumer side knows it: a span
// context and nothing else, like the span the propagator would store. It
// never records; its methods other than SpanContext do nothing. (It does
// not embed the no-op span, which would carry a second span context.)
type remoteSpan struct {
	embedded.Span
	sc trace.SpanContext
}

var _ trace.Span = (*remoteSpan)(nil)

func (s *remoteSpan) SpanContext() trace.SpanContext        { return s.sc }
func (*remoteSpan) IsRecording() bool                       { return false }
func (*remoteSpan) End(...trace.SpanEndOption)              {}
func (*remoteSpan) AddEvent(string, ...trace.EventOption)   {}
func (*remoteSpan) AddLink(trace.Link)                      {}
func (*remoteSpan) RecordError(error, ...trace.EventOption) {}
func (*remoteSpan) SetStatus(codes.Code, string)            {}
func (*remoteSpan) SetName(string)                          {}
func (*remoteSpan) SetAttributes(...attribute.KeyValue)     {}
func (*remoteSpan) TracerProvider() trace.TracerProvider    { return tracenoop.NewTracerProvider() }

// isW3C reports whether p is OpenTelemetry's W3C trace context propagator,
// whose work the tracing middleware can do itself (see parseTraceContext).
func isW3C(p propagation.TextMapPropagator) bool {
	switch p.(type) {
	case propagation.TraceContext, *propagation.TraceContext:
		return spanKey() != nil
	}
	return false
}

// parseTraceContext reads the span context a W3C traceparent (and
// tracestate) in msg's metadata describe, with the rules
// propagation.TraceContext applies: version, trace ID, span ID and flags
// as lower-case hex fields separated by '-'; version ff is invalid;
// version 00 allows no further field (a trailing '-' is tolerated, as the
// propagator does) and no flag bit other than sampled and random; later
// versions may append fields. An unparsable tracestate
// is ignored. It returns an invalid span context when there is none.
func parseTraceContext(msg *message.Message) trace.SpanContext {
	h := msg.Metadata[traceparentKey]
	// version(2) - trace ID(32) - span ID(16) - flags(2)
	const size = 2 + 1 + 32 + 1 + 16 + 1 + 2
	if len(h) < size || h[2] != '-' || h[35] != '-' || h[52] != '-' {
		return trace.SpanContext{}
	}
	var version, flags [1]byte
	var scc trace.SpanContextConfig
	if !unhex(version[:], h[0:2]) || version[0] == 0xff ||
		!unhex(scc.TraceID[:], h[3:35]) || !unhex(scc.SpanID[:], h[36:52]) ||
		!unhex(flags[:], h[53:55]) {
		return trace.SpanContext{}
	}
	// After the flags: nothing, or '-' and (from version 01 on) more
	// fields. The propagator splits at '-', so version 00 allows a
	// trailing '-' with nothing after it.
	if len(h) > size && (h[size] != '-' || version[0] == 0 && len(h) > size+1) {
		return trace.SpanContext{}
	}
	if version[0] == 0 && flags[0] > 3 {
		return trace.SpanContext{}
	}
	scc.TraceFlags = trace.TraceFlags(flags[0]) & (trace.FlagsSampled | trace.FlagsRandom)
	scc.Remote = true
	if s := msg.Metadata[tracestateKey]; s != "" {
		scc.TraceState, _ = trace.ParseTraceState(s)
	}
	sc := trace.NewSpanContext(scc)
	if !sc.IsValid() {
		return trace.SpanContext{}
	}
	return sc
}

// unhex decodes lower-case hex digits from s into dst (len(s) == 2*len(dst)).
func unhex(dst []byte, s string) bool {
	for i := range dst {
		hi, ok1 := hexDigit(s[2*i])
		lo, ok2 := hexDigit(s[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

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
