//go:build !stackprobe

package stackroom

import "testing"

// Reserve must be callable from many goroutines at once (the race detector
// checks it shares nothing) and must not allocate.
func TestReserve(t *testing.T) {
	done := make(chan struct{})
	for range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			Reserve()
			ReserveDeep()
		}()
	}
	for range 8 {
		<-done
	}
	if n := testing.AllocsPerRun(100, Reserve); n != 0 {
		t.Fatalf("Reserve allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, ReserveDeep); n != 0 {
		t.Fatalf("ReserveDeep allocates %v times", n)
	}
}

// BenchmarkGoroutine compares a goroutine that grows its stack deep in a
// call chain with one that calls Reserve first; shallow (no deep chain, no
// Reserve) against reserve-only (Reserve alone) is what one growth of a
// new goroutine's stack costs, whatever the depth.
func BenchmarkGoroutine(b *testing.B) {
	for _, c := range []struct {
		name    string
		reserve bool
		deep    bool
	}{{"plain", false, true}, {"reserve", true, true}, {"shallow", false, false}, {"reserve-only", true, false}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			done := make(chan struct{})
			for b.Loop() {
				go func() {
					if c.reserve {
						Reserve()
					}
					if c.deep {
						deep(12)
					}
					done <- struct{}{}
				}()
				<-done
			}
		})
	}
}

//go:noinline
func deep(n int) byte {
	var pad [96]byte
	if n == 0 {
		return use(&[frame]byte{}) + pad[0]
	}
	pad[n] = byte(n)
	return deep(n-1) + pad[n]
}
