package cost

import "context"

// admittedKey is the context key of the charge a message was admitted with.
type admittedKey struct{}

// admittedCtx is a context that carries the charge a message was admitted
// with. It is context.WithValue for one key, in one allocation instead of
// two (the value context and the boxed Charge): the budget middleware makes
// one for every message it admits.
type admittedCtx struct {
	context.Context
	c Charge
}

// Value returns the context itself for admittedKey and defers every other
// key to the parent.
func (a *admittedCtx) Value(key any) any {
	if key == (admittedKey{}) {
		return a
	}
	return a.Context.Value(key)
}

// WithAdmitted returns a copy of ctx that carries c, the charge a message
// was admitted with. The budget middleware (package middleware) sets it on
// the message's context while the handler runs; a layer inside the budget
// that replaces the message's context uses it to pass the charge on.
func WithAdmitted(ctx context.Context, c Charge) context.Context {
	return &admittedCtx{Context: ctx, c: c}
}

// AdmittedFromCtx returns the charge the message whose context ctx is was
// admitted with, as the budget's estimator priced it (before the budget
// clamped it to its capacity), and false outside a budget middleware.
// Layers inside the budget read it instead of pricing the message again:
// the auto-sizer (package sizing) does. Inside nested budgets it is the
// innermost one's.
func AdmittedFromCtx(ctx context.Context) (Charge, bool) {
	a, ok := ctx.Value(admittedKey{}).(*admittedCtx)
	if !ok {
		return Charge{}, false
	}
	return a.c, true
}
