package producer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"golang.org/x/time/rate"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
)

// ErrRateLimited is returned (wrapped) by a [RateLimited] publisher in
// [Reject] mode when publishing would exceed the rate.
var ErrRateLimited = errors.New("producer: publish rate limit exceeded")

// Mode is what a [RateLimited] publisher does when the rate is used up.
type Mode string

const (
	// Block waits until the vertices are available, or until a message's
	// context ends. It is the default (the zero Mode).
	Block Mode = "block"
	// Reject returns an error wrapping [ErrRateLimited] at once and
	// publishes nothing.
	Reject Mode = "reject"
)

// maxBurst bounds the default burst, one second at the rate.
const maxBurst = math.MaxInt32

// RateLimitConfig configures a [RateLimited] publisher. Each field's YAML
// key is its yaml tag; zero fields take the defaults documented on them.
type RateLimitConfig struct {
	// VerticesPerSecond is the rate: how many vertices may be published
	// per second, on average. [NewRateLimited] requires it positive; in a
	// config section that may be switched off (router's
	// producer.rate_limit) zero means no rate limit.
	VerticesPerSecond float64 `yaml:"vertices_per_second" env:"VERTICES_PER_SECOND"`

	// Burst is the bucket's size in vertices: how far publishing may run
	// ahead of the rate, and the most one Publish call is charged. The
	// bucket starts full. Default: one second at the rate (rounded up).
	Burst int64 `yaml:"burst" env:"BURST"`

	// Mode is block (default: wait for the vertices) or reject (fail at
	// once with [ErrRateLimited]).
	Mode Mode `yaml:"mode" env:"MODE"`

	// DefaultCost is the charge of a message whose count is missing or
	// malformed. Default: the burst, so an unstamped message uses a full
	// bucket, never a free pass. Values above the burst are clamped to it.
	DefaultCost int64 `yaml:"default_cost" env:"DEFAULT_COST"`
}

func (c *RateLimitConfig) setDefaults() {
	if c.Burst == 0 && c.VerticesPerSecond > 0 && !math.IsInf(c.VerticesPerSecond, 0) {
		c.Burst = int64(min(math.Ceil(c.VerticesPerSecond), maxBurst))
	}
	if c.Mode == "" {
		c.Mode = Block
	}
	if c.DefaultCost == 0 && c.Burst > 0 {
		c.DefaultCost = c.Burst
	}
}

// WithDefaults returns c with every zero field set to its default. The
// router reads it to show the effective values of producer.rate_limit.
func (c RateLimitConfig) WithDefaults() RateLimitConfig {
	c.setDefaults()
	return c
}

// Validate reports every invalid field of c, after defaults are applied
// (so zero fields are fine, and a zero VerticesPerSecond means the limit
// is off; [NewRateLimited] requires it positive). The error joins one
// [*spillway.FieldError] per problem.
func (c RateLimitConfig) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &spillway.FieldError{Field: field, Value: value, Reason: reason})
	}
	if r := c.VerticesPerSecond; math.IsNaN(r) || math.IsInf(r, 0) || r < 0 {
		bad("vertices_per_second", strconv.FormatFloat(r, 'g', -1, 64), "must be a finite positive number (0: no rate limit)")
	}
	if c.Burst < 0 {
		bad("burst", strconv.FormatInt(c.Burst, 10), "must be positive (0: one second at the rate)")
	}
	switch c.Mode {
	case Block, Reject:
	default:
		bad("mode", string(c.Mode), "must be block or reject")
	}
	if c.DefaultCost < 0 {
		bad("default_cost", strconv.FormatInt(c.DefaultCost, 10), "must be positive (0: the burst)")
	}
	return errors.Join(errs...)
}

// RateLimited is a message.Publisher decorator that limits publishing to
// a rate in vertices per second, with a burst, using a token bucket
// (golang.org/x/time/rate). Create it with [NewRateLimited].
//
// Each message is charged its vertex count, read from its cost.MetadataKey
// metadata (vertex_count) with cost.ParseCount; it does not count payloads. Put a stamping publisher
// outside it, so messages are stamped before they reach it:
//
//	limited, err := producer.NewRateLimited(broker, producer.RateLimitConfig{VerticesPerSecond: 50_000, Burst: 200_000})
//	...
//	pub := cost.NewStampingPublisher(limited)
//
// (the stamper stamps, then calls this publisher). A message without a
// usable count is charged [RateLimitConfig.DefaultCost].
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
// A RateLimited publisher is safe for concurrent use if the wrapped
// publisher is; callers share one bucket.
type RateLimited struct {
	pub         message.Publisher
	lim         *rate.Limiter
	mode        Mode
	burst       int64
	defaultCost int64

	throttled atomic.Uint64
	rejected  atomic.Uint64
	waited    atomic.Int64 // nanoseconds
}

var _ message.Publisher = (*RateLimited)(nil)

// NewRateLimited wraps pub with the limit cfg describes (defaults filled
// in). Errors are a [*spillway.FieldError] (matching
// [spillway.ErrInvalidConfig]): on "pub" if it is nil, else those of
// [RateLimitConfig.Validate], or on "vertices_per_second" if it is not
// positive. The bucket starts full.
func NewRateLimited(pub message.Publisher, cfg RateLimitConfig) (*RateLimited, error) {
	if pub == nil {
		return nil, required("pub")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.VerticesPerSecond == 0 {
		return nil, &spillway.FieldError{Field: "vertices_per_second", Value: "0", Reason: "must be positive"}
	}
	cfg.setDefaults()
	cfg.DefaultCost = min(cfg.DefaultCost, cfg.Burst)
	return &RateLimited{
		pub:         pub,
		lim:         rate.NewLimiter(rate.Limit(cfg.VerticesPerSecond), int(cfg.Burst)),
		mode:        cfg.Mode,
		burst:       cfg.Burst,
		defaultCost: cfg.DefaultCost,
	}, nil
}

// charge returns what one call costs, clamped to the burst.
func (p *RateLimited) charge(messages []*message.Message) int64 {
	var n int64
	for _, msg := range messages {
		if msg == nil {
			continue
		}
		v, src := cost.ParseCount(msg.Metadata.Get(cost.MetadataKey), len(msg.Payload))
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
// [RateLimited]) and then publishes every message with one call to the
// wrapped publisher.
func (p *RateLimited) Publish(topic string, messages ...*message.Message) error {
	n := p.charge(messages)
	if n > 0 {
		now := time.Now()
		if p.mode == Reject {
			if !p.lim.AllowN(now, int(n)) {
				p.rejected.Add(1)
				return fmt.Errorf("%w: %d vertices for topic %q", ErrRateLimited, n, topic)
			}
		} else if err := p.wait(now, n, messages); err != nil {
			return err
		}
	}
	return p.pub.Publish(topic, messages...)
}

func (p *RateLimited) wait(now time.Time, n int64, messages []*message.Message) error {
	r := p.lim.ReserveN(now, int(n)) // n <= burst, so always OK
	delay := r.DelayFrom(now)
	if delay <= 0 {
		return nil
	}
	ctx, stop := messagesContext(messages)
	defer stop()
	if ctx.Err() != nil {
		r.CancelAt(now)
		return fmt.Errorf("producer: waiting for publish rate: %w", context.Cause(ctx))
	}
	p.throttled.Add(1)
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		p.waited.Add(int64(delay))
		return nil
	case <-ctx.Done():
		r.Cancel()
		return fmt.Errorf("producer: waiting for publish rate: %w", context.Cause(ctx))
	}
}

// Close closes the wrapped publisher.
func (p *RateLimited) Close() error { return p.pub.Close() }

// Stats counts how a [RateLimited] or [LagThrottled] publisher held
// publishing back. The router exports Waited as spillway.producer.wait,
// the lag throttle's Throttled as spillway.producer.throttled and
// Rejected as spillway.producer.rejected.
type Stats struct {
	// Throttled counts the Publish calls that had to wait.
	Throttled uint64
	// Waited is the total time calls waited (completed waits only).
	Waited time.Duration
	// Rejected counts the calls a [RateLimited] publisher in [Reject]
	// mode refused; always 0 for a [LagThrottled] one.
	Rejected uint64
}

// Stats returns the counters. Safe for concurrent use.
func (p *RateLimited) Stats() Stats {
	return Stats{
		Throttled: p.throttled.Load(),
		Waited:    time.Duration(p.waited.Load()),
		Rejected:  p.rejected.Load(),
	}
}
