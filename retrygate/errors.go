package retrygate

import (
	"errors"

	"github.com/cenkalti/backoff/v5"

	"github.com/spillway-go/spillway/cost"
)

// errDeferred is wrapped by the error the middleware returns when it defers
// a message by nacking it ([DeferNack]); the handler's own error is wrapped
// too.
var errDeferred = errors.New("retrygate: message deferred for redelivery")

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: the gate dead-letters the message on
// this failure instead of retrying it. The mark survives wrapping with %w,
// and errors.Is and errors.As see through it to err. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent is the default failure classifier ([WithIsPermanent]). It
// reports whether err, or any error it wraps, is
//
//   - marked with [Permanent] (or cenkalti/backoff's Permanent), or
//   - a geometry that cannot be decoded: one of the cost package's decode
//     errors ([cost.ErrMalformed], [cost.ErrTooLarge]), which no retry
//     will change.
func IsPermanent(err error) bool {
	if err == nil {
		return false
	}
	var p *permanentError
	if errors.As(err, &p) {
		return true
	}
	var bp *backoff.PermanentError
	if errors.As(err, &bp) {
		return true
	}
	return cost.IsUndecodable(err)
}
