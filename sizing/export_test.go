package sizing

// Hooks into an AutoSizer, for the tests.

// Begin brackets one measured call without a Watermill handler: end takes
// the vertices the call completed. The call holds none of the budget.
func Begin(a *AutoSizer) (end func(vertices int64)) { return a.begin(0) }

// BeginCharged is Begin for a call that holds charged vertices of the
// budget.
func BeginCharged(a *AutoSizer, charged int64) (end func(vertices int64)) { return a.begin(charged) }

// MeasuredWindows is how many windows the throughput is the median of now.
func MeasuredWindows(a *AutoSizer) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.rates)
}

// ErrEmptySample is what a sample without geometries fails with.
var ErrEmptySample = errEmptySample

// DeadlineBound is Recommend's deadline bound formula.
var DeadlineBound = deadlineBound
