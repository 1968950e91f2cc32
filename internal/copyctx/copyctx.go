// Package copyctx marks the context of a copy that Spillway publishes on
// a delivery's behalf (a retry, dead-letter or oversize copy), so
// that a Kafka publisher keys the copy by the Kafka key of the record it
// copies rather than by the copy's metadata: a record from a producer that
// is not Watermill has a key but no entity_id and no UUID header.
package copyctx

import "context"

type copyKey struct{}

// Of returns the context for a copy of the message delivered with ctx:
// ctx's values (the consumed record's key, the trace) without its
// cancellation, marked as a copy's.
func Of(ctx context.Context) context.Context {
	return context.WithValue(context.WithoutCancel(ctx), copyKey{}, true)
}

// Is reports whether ctx was returned by [Of] (or derives from it).
func Is(ctx context.Context) bool {
	v, _ := ctx.Value(copyKey{}).(bool)
	return v
}
