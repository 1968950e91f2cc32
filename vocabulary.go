package spillway

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidConfig matches every [*FieldError] with errors.Is, whichever
// package's Validate returned it.
var ErrInvalidConfig = errors.New("invalid config")

// FieldError is one invalid configuration value. Every Validate in
// Spillway returns these, one per problem, joined with errors.Join; get at
// them with errors.As, or match any of them with errors.Is(err,
// [ErrInvalidConfig]).
type FieldError struct {
	// Field is the setting's path as written in YAML, e.g.
	// kafka.rebalance_timeout, relative to the Config that reported it; a
	// Config embedded in another has its section prepended by the outer
	// Validate.
	Field string
	// Value is the offending value as written ("[redacted]" for a secret).
	Value string
	// Reason says what is wrong with it.
	Reason string
	// Source is where the value came from when known: a file:line or an
	// environment variable.
	Source string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	b.WriteString(e.Field)
	if e.Source != "" {
		b.WriteString(" (")
		b.WriteString(e.Source)
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	b.WriteString(", got ")
	b.WriteString(strconv.Quote(e.Value))
	return b.String()
}

// Is reports whether target is [ErrInvalidConfig].
func (e *FieldError) Is(target error) bool { return target == ErrInvalidConfig }

// Off, in a numeric setting documented as accepting it, switches that
// setting's mechanism off; zero means "the default" everywhere.
const Off = -1

// Pressure is a sustained-saturation signal: SaturatedFor returns how long
// the consumer has been saturated without a break, or 0 when it is not
// saturated now. Implementations must be cheap and safe for concurrent use;
// shedding and the retry gate call it from message goroutines.
// *middleware.VertexBudget implements it; so can a consumer-lag signal.
type Pressure interface {
	// SaturatedFor returns how long the consumer has been saturated
	// without a break; 0 when it is not saturated now.
	SaturatedFor() time.Duration
}

// PressureFunc adapts a function to [Pressure].
type PressureFunc func() time.Duration

// SaturatedFor calls f.
func (f PressureFunc) SaturatedFor() time.Duration { return f() }
