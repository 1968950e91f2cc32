// Package telhint is what the router tells the telemetry package about
// its stack, outside the public API.
package telhint

// Outermost returns a telemetry.Option (as any: this package cannot
// import telemetry) that tells the tracing middleware no telemetry record
// can be in a message's context when it receives the message: it is the
// outermost telemetry layer, below the broker's context. It then does not
// look for one, a walk of the whole context chain on every message. Set
// by package telemetry as it is initialised.
var Outermost func() any
