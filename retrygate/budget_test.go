package retrygate

import (
	"sync"
	"testing"

	"github.com/spillway-go/spillway"
)

// Under concurrent fresh traffic and retries, the retries granted never
// exceed what the fresh messages earned (the limiter is off here), and
// once the fresh traffic stops every earned credit up to the burst can be
// spent.
func TestRetryBudgetConcurrentEarnAndTake(t *testing.T) {
	const (
		workers = 8
		fresh   = 2000 // per worker
		ratio   = 0.25
		burst   = 1 << 20
	)
	b := newRetryBudget(Config{RetryRate: spillway.Off, RetryRatio: ratio, RetryBurst: burst})
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted int
	)
	for range workers {
		wg.Go(func() {
			n := 0
			for i := range fresh {
				b.earn()
				if i%3 == 0 && b.take() {
					n++
				}
			}
			mu.Lock()
			granted += n
			mu.Unlock()
		})
	}
	wg.Wait()
	earned := int(ratio * workers * fresh)
	if granted > earned {
		t.Fatalf("granted %d retries, more than the %d earned", granted, earned)
	}
	for b.take() {
		granted++
	}
	if granted != earned {
		t.Fatalf("granted %d retries in all, want the %d earned", granted, earned)
	}
}
