package middleware

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Lag throttle defaults.
const (
	DefaultThrottleStep = 100 * time.Millisecond
	DefaultThrottleMax  = 5 * time.Second
)

// LagReader reports the consumers' total lag. It must answer from a cache
// kept fresh in the background: a [LagThrottledPublisher] calls it before
// every publish. telemetry.LagSampler implements it.
type LagReader interface {
	TotalLag() int64
}

// LagThrottleOption configures a [LagThrottledPublisher].
type LagThrottleOption func(*LagThrottledPublisher)

// WithThrottleStep sets the delay added per threshold's worth of lag above
// the threshold. Default [DefaultThrottleStep]. Non-positive values are
// ignored.
func WithThrottleStep(d time.Duration) LagThrottleOption {
	return func(p *LagThrottledPublisher) {
		if d > 0 {
			p.step = d
		}
	}
}

// WithThrottleMax caps the delay of one publish. Default
// [DefaultThrottleMax]. Non-positive values are ignored.
func WithThrottleMax(d time.Duration) LagThrottleOption {
	return func(p *LagThrottledPublisher) {
		if d > 0 {
			p.maxDelay = d
		}
	}
}

// LagThrottledPublisher is a message.Publisher decorator that slows
// publishing down while the consumers lag: it closes the backpressure loop
// from a consumer group back to its producers. Create it with
// [NewLagThrottledPublisher].
//
// Before each Publish call it reads the total lag from its [LagReader] and,
// when the lag exceeds the threshold, waits
//
//	step × (lag − threshold) / threshold, at most max
//
// so the delay grows in proportion to how far the consumers are behind
// (with the defaults: 100 ms at twice the threshold, 1 s at eleven times,
// never more than 5 s), and vanishes as soon as the lag falls back to the
// threshold. The wait is per call, not per message. If the context of one
// of the messages ends during the wait, Publish returns an error wrapping
// that context's error and publishes nothing.
//
// The lag is never queried per send: the reader answers from its cache
// (telemetry.LagSampler samples in the background), so the throttle reacts
// within one sampling interval.
//
// A LagThrottledPublisher is safe for concurrent use if the wrapped
// publisher and the reader are; concurrent callers wait independently.
type LagThrottledPublisher struct {
	pub       message.Publisher
	lag       LagReader
	threshold int64
	step      time.Duration
	maxDelay  time.Duration

	throttled atomic.Uint64
	waited    atomic.Int64 // nanoseconds
}

var _ message.Publisher = (*LagThrottledPublisher)(nil)

// NewLagThrottledPublisher wraps pub so that publishing slows down while
// lag.TotalLag() exceeds threshold. It panics if pub or lag is nil or
// threshold is not positive.
func NewLagThrottledPublisher(pub message.Publisher, lag LagReader, threshold int64, opts ...LagThrottleOption) *LagThrottledPublisher {
	if pub == nil {
		panic("spillway: NewLagThrottledPublisher: nil publisher")
	}
	if lag == nil {
		panic("spillway: NewLagThrottledPublisher: nil lag reader")
	}
	if threshold <= 0 {
		panic("spillway: NewLagThrottledPublisher: threshold must be positive")
	}
	p := &LagThrottledPublisher{
		pub:       pub,
		lag:       lag,
		threshold: threshold,
		step:      DefaultThrottleStep,
		maxDelay:  DefaultThrottleMax,
	}
	for _, o := range opts {
		if o != nil {
			o(p)
		}
	}
	return p
}

// Delay returns the wait the next Publish would make at the current lag.
func (p *LagThrottledPublisher) Delay() time.Duration {
	return throttleDelay(p.lag.TotalLag(), p.threshold, p.step, p.maxDelay)
}

func throttleDelay(lag, threshold int64, step, maxDelay time.Duration) time.Duration {
	if lag <= threshold {
		return 0
	}
	excess := float64(lag-threshold) / float64(threshold)
	d := excess * float64(step)
	if d >= float64(maxDelay) {
		return maxDelay
	}
	return max(time.Duration(d), 1)
}

// Publish waits as long as the lag asks for (see [LagThrottledPublisher])
// and then publishes every message with one call to the wrapped publisher.
func (p *LagThrottledPublisher) Publish(topic string, messages ...*message.Message) error {
	if d := p.Delay(); d > 0 {
		p.throttled.Add(1)
		ctx, stop := messagesContext(messages)
		err := sleepCtx(ctx, d)
		stop()
		if err != nil {
			return fmt.Errorf("spillway: publish throttled by consumer lag: %w", err)
		}
		p.waited.Add(int64(d))
	}
	return p.pub.Publish(topic, messages...)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Close closes the wrapped publisher.
func (p *LagThrottledPublisher) Close() error { return p.pub.Close() }

// LagThrottleStats counts a [LagThrottledPublisher]'s waits.
type LagThrottleStats struct {
	Throttled uint64        // calls that had to wait
	Waited    time.Duration // total time waited (completed waits only)
}

// Stats returns the counters. Safe for concurrent use.
func (p *LagThrottledPublisher) Stats() LagThrottleStats {
	return LagThrottleStats{Throttled: p.throttled.Load(), Waited: time.Duration(p.waited.Load())}
}
