package retrygate

import (
	"math"
	"sync"

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
type retryBudget struct {
	lim   *rate.Limiter
	ratio float64 // credits per fresh message; 0: none
	max   float64 // cap on banked credits

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
	b.mu.Lock()
	b.credits = min(b.max, b.credits+b.ratio)
	b.mu.Unlock()
}

// take draws one retry token, reporting whether there was one.
func (b *retryBudget) take() bool {
	b.mu.Lock()
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
	c := b.credits
	b.mu.Unlock()
	if b.lim.Limit() == rate.Inf {
		return math.Inf(1)
	}
	return c + max(0, b.lim.Tokens())
}
