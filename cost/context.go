package cost

import "context"

// admittedKey is the context key of the charge a message was admitted with.
type admittedKey struct{}

// WithAdmitted returns a copy of ctx that carries c, the charge a message
// was admitted with. The budget middleware (package middleware) sets it on
// the message's context while the handler runs; a layer inside the budget
// that replaces the message's context uses it to pass the charge on.
func WithAdmitted(ctx context.Context, c Charge) context.Context {
	return context.WithValue(ctx, admittedKey{}, c)
}

// AdmittedFromCtx returns the charge the message whose context ctx is was
// admitted with, as the budget's estimator priced it (before the budget
// clamped it to its capacity), and false outside a budget middleware.
// Layers inside the budget read it instead of pricing the message again:
// the auto-sizer (package sizing) does. Inside nested budgets it is the
// innermost one's.
func AdmittedFromCtx(ctx context.Context) (Charge, bool) {
	c, ok := ctx.Value(admittedKey{}).(Charge)
	return c, ok
}
