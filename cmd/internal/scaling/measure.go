package scaling

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/refwork"
)

// sample is what one consumer run measured.
type sample struct {
	messages   int     // messages handled in the window
	seconds    float64 // wall time of the window
	cpuSeconds float64 // user + system CPU of this process in the window
	peakHeap   uint64  // the most heap in live and unswept objects seen in the window
	failures   int64   // payloads the handler could not decode
}

// measure runs the consumer build returns until it has handled total
// messages over handlers handlers. The window opens when the last handler
// receives its first message (so group joins and subscriptions are over)
// and closes at the last message; the messages handled before it opened
// are not counted. Holding the first messages until every handler has
// one would be neater, but Spillway's budget admits them, so a budget
// filled by the early handlers' held messages would keep the late ones
// from ever starting.
func measure(ctx context.Context, o *Options, work refwork.Func, handlers, total int, build func(handlerFor) (*consumer, error)) (sample, error) {
	var (
		handled  atomic.Int64
		failures atomic.Int64
		started  atomic.Int32
		first    = make([]atomic.Bool, handlers)
		gate     = make(chan struct{})
		done     = make(chan struct{})
		t0       time.Time
		cpu0     time.Duration
		n0       int64
	)
	h := func(j int) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			if first[j].CompareAndSwap(false, true) && started.Add(1) == int32(handlers) {
				n0, cpu0, t0 = handled.Load(), processCPU(), time.Now()
				close(gate)
			}
			if _, err := refwork.Process(work, msg.Payload, 1); err != nil {
				failures.Add(1) // acked anyway: a nack would loop
			}
			if handled.Add(1) == int64(total) {
				close(done)
			}
			return nil
		}
	}
	runtime.GC()
	c, err := build(h)
	if err != nil {
		return sample{}, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.run(runCtx) }()
	stop := func() error {
		cerr := c.close()
		select {
		case err := <-errc:
			return errors.Join(cerr, err)
		case <-time.After(30 * time.Second):
			return errors.Join(cerr, errors.New("the consumer did not stop within 30s of Close"))
		}
	}

	select {
	case <-gate:
	case err := <-errc:
		_ = c.close()
		return sample{}, fmt.Errorf("the consumer stopped before every handler had a message: %v", err)
	case <-time.After(o.StartTimeout):
		_ = stop()
		return sample{}, fmt.Errorf("not every handler had a message within %v (%d of %d)", o.StartTimeout, started.Load(), handlers)
	case <-ctx.Done():
		_ = stop()
		return sample{}, ctx.Err()
	}
	peak := sampleHeap()
	select {
	case <-done:
	case err := <-errc:
		_ = c.close()
		peak()
		return sample{}, fmt.Errorf("the consumer stopped after %d of %d messages: %v", handled.Load(), total, err)
	case <-time.After(o.RunTimeout):
		_ = stop()
		peak()
		return sample{}, fmt.Errorf("only %d of %d messages consumed within %v", handled.Load(), total, o.RunTimeout)
	case <-ctx.Done():
		_ = stop()
		peak()
		return sample{}, ctx.Err()
	}
	s := sample{
		messages:   total - int(n0),
		seconds:    time.Since(t0).Seconds(),
		cpuSeconds: (processCPU() - cpu0).Seconds(),
		failures:   failures.Load(),
	}
	s.peakHeap = peak()
	if err := stop(); err != nil {
		return s, fmt.Errorf("closing the consumer: %w", err)
	}
	return s, nil
}

// processCPU returns the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapMetric is the heap held by objects, live or not yet swept.
const heapMetric = "/memory/classes/heap/objects:bytes"

// sampleHeap reads the heap every few milliseconds until the returned
// function is called, which returns the peak.
func sampleHeap() func() uint64 {
	var (
		stop = make(chan struct{})
		wg   sync.WaitGroup
		peak uint64
	)
	s := []metrics.Sample{{Name: heapMetric}}
	read := func() {
		metrics.Read(s)
		if s[0].Value.Kind() == metrics.KindUint64 {
			peak = max(peak, s[0].Value.Uint64())
		}
	}
	read()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				read()
				return
			case <-t.C:
				read()
			}
		}
	}()
	var once sync.Once
	return func() uint64 {
		once.Do(func() { close(stop); wg.Wait() })
		return peak
	}
}
