package retrygate

import (
	"math"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"
)

// retryBudget is the token bucket every retry draws from. It has two
// sources of tokens, each holding at most burst:
//
//   - a rate.Limiter refilled at rate tokens per second (the floor that lets
//     a quiet consumer retry at all), and
//   - credits earned by fresh traffic, ratio tokens per fresh message (so
//     retries scale with load but can never exceed ratio × fresh).
//
// A retry spends an earned credit first and falls back to the limiter.
//
// Fresh messages only count themselves (one atomic add, no lock: every
// message passes here, a retry rarely does); a take or a read turns the
// count into credits. Credits only grow between takes, so capping them
// once for all the fresh messages since the last take gives what capping
// after each would.
type retryBudget struct {
	lim   *rate.Limiter
	ratio float64 // credits per fresh message; 0: none
	max   float64 // cap on banked credits

	fresh atomic.Int64 // fresh messages not yet turned into credits

	mu      sync.Mutex
	credits float64
}

func newRetryBudget(c Config) *retryBudget {
	b := &retryBudget{max: float64(c.RetryBurst)}
	switch {
	case math.IsInf(c.RetryRate, 1):
		b.lim = rate.NewLimiter(rate.Inf, c.RetryBurst)
	case c.RetryRate > 0:
		b.lim = rate.NewLimiter(rate.Limit(c.RetryRate), c.RetryBurst)
	default: // Off: the limiter never grants
		b.lim = rate.NewLimiter(0, 0)
	}
	if c.RetryRatio > 0 {
		b.ratio = c.RetryRatio
	}
	return b
}

// earn credits one fresh message.
func (b *retryBudget) earn() {
	if b.ratio == 0 {
		return
	}
	b.fresh.Add(1)
}

// settle turns the fresh messages counted since the last call into
// credits. b.mu must be held.
func (b *retryBudget) settle() {
	if n := b.fresh.Swap(0); n > 0 {
		b.credits = min(b.max, b.credits+b.ratio*float64(n))
	}
}

// take draws one retry token, reporting whether there was one.
func (b *retryBudget) take() bool {
	b.mu.Lock()
	b.settle()
	if b.credits >= 1 {
		b.credits--
		b.mu.Unlock()
		return true
	}
	b.mu.Unlock()
	return b.lim.Allow()
}

// tokens returns the retries available now (fractions included).
func (b *retryBudget) tokens() float64 {
	b.mu.Lock()
	b.settle()
	c := b.credits
	b.mu.Unlock()
	if b.lim.Limit() == rate.Inf {
		return math.Inf(1)
	}
	return c + max(0, b.lim.Tokens())
}
