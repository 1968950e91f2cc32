// Package telhint is what the router and the telemetry package tell each
// other about a message's stack and telemetry, outside the public API.
//
// Both concern the message goroutine's stack (internal/stackroom): a
// router whose middleware stack fits in the stack Watermill's message
// goroutine starts with must keep it that way, so the tracing middleware
// must not grow the stack for a message it starts no span for, and the
// router must not call telemetry's admission hook, the deepest path of the
// stack, for a message it has nothing to record about.
package telhint

// Quiet is implemented by the context the tracing middleware gives a
// message it starts no span for. The router reads it from the message's
// context as that reaches the budget slot, without a lookup.
type Quiet interface {
	// TelemetryQuiet reports whether telemetry has nothing to record about
	// the message's admission: the message has no telemetry record and its
	// span does not record. Asked of the context that reaches the budget
	// slot, it covers the meter too: a metrics middleware that measures
	// wraps that context in the record it makes.
	TelemetryQuiet() bool
}

// QuietMarker is implemented by the context the router gives each message
// at the top of its stack. A tracing middleware that is the outermost
// telemetry layer (Outermost) of a stack that fits (StackFits), starts no
// span for the message and has no producer's span context to carry marks
// that context quiet instead of allocating a context of its own. Only such
// a router admits a quiet message without the admission hook; any other
// runs the hook, whose lookups the quiet context answers.
//
// A marked message has no telemetry record, since nothing outside the
// tracing middleware makes one, and the middleware found no span that
// records. A metrics middleware that measures wraps the marked context in
// its record, so the router, reading the mark only when the marked context
// itself reaches its budget slot, still sees the meter.
type QuietMarker interface {
	MarkTelemetryQuiet()
}

// StackFits returns a telemetry.Option (as any: this package cannot
// import telemetry) that tells the tracing middleware the stack below it
// fits in a new goroutine's stack when it starts no span, so that it does
// not grow the stack then. Set by package telemetry as it is initialised.
var StackFits func() any

// Outermost returns a telemetry.Option (as any) that tells the tracing
// middleware no telemetry record can be in a message's context when it
// receives the message: it is the outermost telemetry layer, below the
// broker's context. It then does not look for one, a walk of the whole
// context chain on every message. Set by package telemetry as it is
// initialised.
var Outermost func() any
