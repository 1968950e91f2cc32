package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"golang.org/x/time/rate"

	"github.com/spillway-go/spillway/cost"
)

// ErrRateLimited is returned (wrapped) by a [RateLimitedPublisher] in
// [RateLimitReject] mode when publishing would exceed the rate.
var ErrRateLimited = errors.New("spillway: publish rate limit exceeded")

// RateLimitMode is what a [RateLimitedPublisher] does when the rate is used
// up.
type RateLimitMode uint8

const (
	// RateLimitBlock waits until the vertices are available, or until a
	// message's context ends.
	RateLimitBlock RateLimitMode = iota
	// RateLimitReject returns an error wrapping [ErrRateLimited] at once
	// and publishes nothing.
	RateLimitReject
)

// String returns "block" or "reject".
func (m RateLimitMode) String() string {
	switch m {
	case RateLimitBlock:
		return "block"
	case RateLimitReject:
		return "reject"
	}
	return fmt.Sprintf("RateLimitMode(%d)", m)
}

// RateLimitOption configures a [RateLimitedPublisher].
type RateLimitOption func(*RateLimitedPublisher)

// WithRateLimitMetadataKey reads the count from key instead of
// cost.MetadataKey. An empty key is ignored.
func WithRateLimitMetadataKey(key string) RateLimitOption {
	return func(p *RateLimitedPublisher) {
		if key != "" {
			p.key = key
		}
	}
}

// WithRateLimitDefaultCost sets the charge of a message whose count is
// missing or malformed. Default: the burst, so an unstamped message uses a
// full bucket, never a free pass. Values above the burst are clamped to it.
func WithRateLimitDefaultCost(vertices int64) RateLimitOption {
	return func(p *RateLimitedPublisher) {
		if vertices >= 0 {
			p.defaultCost = vertices
		}
	}
}

// RateLimitedPublisher is a message.Publisher decorator that limits
// publishing to a rate in vertices per second, with a burst, using a token
// bucket (golang.org/x/time/rate). Create it with [NewRateLimitedPublisher].
//
// Each message is charged its vertex count, read from its metadata with
// cost.ParseCount; it does not count payloads. Put a stamping publisher
// outside it, so messages are stamped before they reach it:
//
//	cost.NewStampingPublisher(middleware.NewRateLimitedPublisher(broker, 50_000, 200_000, middleware.RateLimitBlock))
//
// (the stamper stamps, then calls this publisher). A message without a
// usable count is charged the default cost ([WithRateLimitDefaultCost]).
//
// One Publish call is charged as a whole: the sum of its messages' counts,
// clamped to the burst, so a call larger than the burst waits for a full
// bucket instead of never fitting. In block mode the call waits until the
// vertices are available; if any message's context ends first it returns
// an error wrapping that context's error, gives the vertices back and
// publishes nothing. In reject mode it returns an error wrapping
// [ErrRateLimited] unless the vertices are available now, and then
// publishes nothing. A publish error from the wrapped publisher does not
// refund the vertices.
//
// A RateLimitedPublisher is safe for concurrent use if the wrapped
// publisher is; callers share one bucket.
type RateLimitedPublisher struct {
	pub         message.Publisher
	lim         *rate.Limiter
	mode        RateLimitMode
	burst       int64
	key         string
	defaultCost int64

	published atomic.Uint64
	rejected  atomic.Uint64
	vertices  atomic.Int64
	waited    atomic.Int64 // nanoseconds
}

var _ message.Publisher = (*RateLimitedPublisher)(nil)

// NewRateLimitedPublisher wraps pub with a limit of verticesPerSecond and
// a bucket of burst vertices (also the most one call can be charged). It
// panics if pub is nil, verticesPerSecond is not positive, or burst is not
// positive. The bucket starts full.
func NewRateLimitedPublisher(pub message.Publisher, verticesPerSecond float64, burst int, mode RateLimitMode, opts ...RateLimitOption) *RateLimitedPublisher {
	if pub == nil {
		panic("spillway: NewRateLimitedPublisher: nil publisher")
	}
	if !(verticesPerSecond > 0) {
		panic("spillway: NewRateLimitedPublisher: verticesPerSecond must be positive")
	}
	if burst <= 0 {
		panic("spillway: NewRateLimitedPublisher: burst must be positive")
	}
	p := &RateLimitedPublisher{
		pub:         pub,
		lim:         rate.NewLimiter(rate.Limit(verticesPerSecond), burst),
		mode:        mode,
		burst:       int64(burst),
		key:         cost.MetadataKey,
		defaultCost: int64(burst),
	}
	for _, o := range opts {
		if o != nil {
			o(p)
		}
	}
	p.defaultCost = min(p.defaultCost, p.burst)
	return p
}

// charge returns what one call costs, clamped to the burst.
func (p *RateLimitedPublisher) charge(messages []*message.Message) int64 {
	var n int64
	for _, msg := range messages {
		if msg == nil {
			continue
		}
		v, src := cost.ParseCount(msg.Metadata.Get(p.key), len(msg.Payload))
		if src != cost.SourceHeader {
			v = p.defaultCost
		}
		n += min(v, p.burst)
		if n >= p.burst {
			return p.burst
		}
	}
	return n
}

// Publish charges the call's vertices against the bucket (see
// [RateLimitedPublisher]) and then publishes every message with one call to
// the wrapped publisher.
func (p *RateLimitedPublisher) Publish(topic string, messages ...*message.Message) error {
	n := p.charge(messages)
	if n > 0 {
		now := time.Now()
		if p.mode == RateLimitReject {
			if !p.lim.AllowN(now, int(n)) {
				p.rejected.Add(1)
				return fmt.Errorf("%w: %d vertices for topic %q", ErrRateLimited, n, topic)
			}
		} else if err := p.wait(now, n, messages); err != nil {
			return err
		}
	}
	p.published.Add(uint64(len(messages)))
	p.vertices.Add(n)
	return p.pub.Publish(topic, messages...)
}

func (p *RateLimitedPublisher) wait(now time.Time, n int64, messages []*message.Message) error {
	r := p.lim.ReserveN(now, int(n)) // n <= burst, so always OK
	delay := r.DelayFrom(now)
	if delay <= 0 {
		return nil
	}
	ctx, stop := messagesContext(messages)
	defer stop()
	if ctx.Err() != nil {
		r.CancelAt(now)
		return fmt.Errorf("spillway: waiting for publish rate: %w", context.Cause(ctx))
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		p.waited.Add(int64(delay))
		return nil
	case <-ctx.Done():
		r.Cancel()
		return fmt.Errorf("spillway: waiting for publish rate: %w", context.Cause(ctx))
	}
}

// messagesContext returns a context that ends when the context of any of
// the messages ends, and a function releasing it.
func messagesContext(messages []*message.Message) (context.Context, func()) {
	var ctxs []context.Context
	for _, msg := range messages {
		if msg != nil {
			ctxs = append(ctxs, msg.Context())
		}
	}
	switch len(ctxs) {
	case 0:
		return context.Background(), func() {}
	case 1:
		return ctxs[0], func() {}
	}
	ctx, cancel := context.WithCancelCause(ctxs[0])
	stops := make([]func() bool, 0, len(ctxs)-1)
	for _, c := range ctxs[1:] {
		stops = append(stops, context.AfterFunc(c, func() { cancel(c.Err()) }))
	}
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel(nil)
	}
}

// Close closes the wrapped publisher.
func (p *RateLimitedPublisher) Close() error { return p.pub.Close() }

// RateLimitStats counts a [RateLimitedPublisher]'s work.
type RateLimitStats struct {
	Published uint64        // messages passed to the wrapped publisher
	Vertices  int64         // vertices charged for them
	Rejected  uint64        // calls refused in reject mode
	Waited    time.Duration // total time calls spent waiting in block mode
}

// Stats returns the counters. Safe for concurrent use.
func (p *RateLimitedPublisher) Stats() RateLimitStats {
	return RateLimitStats{
		Published: p.published.Load(),
		Vertices:  p.vertices.Load(),
		Rejected:  p.rejected.Load(),
		Waited:    time.Duration(p.waited.Load()),
	}
}

// Mode returns the publisher's mode.
func (p *RateLimitedPublisher) Mode() RateLimitMode { return p.mode }
