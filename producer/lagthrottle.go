package producer

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
)

// Lag throttle defaults.
const (
	defaultThrottleStep = 100 * time.Millisecond
	defaultThrottleMax  = 5 * time.Second
)

// LagThrottleConfig configures a [LagThrottled] publisher. Each field's
// YAML key is its yaml tag; zero fields take the defaults documented on
// them.
type LagThrottleConfig struct {
	// Threshold is the total lag (messages) above which publishing slows
	// down; at or below it there is no delay. [NewLagThrottled] requires
	// it positive; in a config section that may be switched off (router's
	// producer.lag_throttle) zero means no throttle.
	Threshold int64 `yaml:"threshold" env:"THRESHOLD"`

	// Step is the delay added per threshold's worth of lag above the
	// threshold. Default 100ms.
	Step time.Duration `yaml:"step" env:"STEP"`

	// Max caps the delay of one publish. Default 5s.
	Max time.Duration `yaml:"max" env:"MAX"`
}

func (c *LagThrottleConfig) setDefaults() {
	if c.Step == 0 {
		c.Step = defaultThrottleStep
	}
	if c.Max == 0 {
		c.Max = defaultThrottleMax
	}
}

// WithDefaults returns c with every zero field set to its default. The
// router reads it to show the effective values of producer.lag_throttle.
func (c LagThrottleConfig) WithDefaults() LagThrottleConfig {
	c.setDefaults()
	return c
}

// Validate reports every invalid field of c, after defaults are applied
// (so zero fields are fine, and a zero Threshold means the throttle is
// off; [NewLagThrottled] requires it positive). The error joins one
// [*spillway.FieldError] per problem.
func (c LagThrottleConfig) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &spillway.FieldError{Field: field, Value: value, Reason: reason})
	}
	if c.Threshold < 0 {
		bad("threshold", strconv.FormatInt(c.Threshold, 10), "must be positive (0: no throttle)")
	}
	if c.Step < 0 {
		bad("step", c.Step.String(), "must be positive")
	}
	if c.Max < 0 {
		bad("max", c.Max.String(), "must be positive")
	}
	return errors.Join(errs...)
}

// LagThrottled is a message.Publisher decorator that slows publishing down
// while the consumers lag: it closes the backpressure loop from a consumer
// group back to its producers. Create it with [NewLagThrottled].
//
// Before each Publish call it reads the total lag from its lag reader and,
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
// A LagThrottled publisher is safe for concurrent use if the wrapped
// publisher and the reader are; concurrent callers wait independently.
type LagThrottled struct {
	pub       message.Publisher
	lag       interface{ TotalLag() int64 }
	threshold int64
	step      time.Duration
	maxDelay  time.Duration

	throttled atomic.Uint64
	waited    atomic.Int64 // nanoseconds
}

var _ message.Publisher = (*LagThrottled)(nil)

// NewLagThrottled wraps pub so that publishing slows down while
// lag.TotalLag(), the consumers' total lag, exceeds cfg.Threshold (defaults
// filled in). lag is called before every publish, so it must answer from a
// cache kept fresh in the background, as telemetry.LagSampler does. Errors are
// a [*spillway.FieldError] (matching [spillway.ErrInvalidConfig]): on "pub"
// or "lag" if it is nil, else those of [LagThrottleConfig.Validate], or on
// "threshold" if it is not positive.
func NewLagThrottled(pub message.Publisher, lag interface{ TotalLag() int64 }, cfg LagThrottleConfig) (*LagThrottled, error) {
	if pub == nil {
		return nil, required("pub")
	}
	if lag == nil {
		return nil, required("lag")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Threshold == 0 {
		return nil, &spillway.FieldError{Field: "threshold", Value: "0", Reason: "must be positive"}
	}
	cfg.setDefaults()
	return &LagThrottled{
		pub:       pub,
		lag:       lag,
		threshold: cfg.Threshold,
		step:      cfg.Step,
		maxDelay:  cfg.Max,
	}, nil
}

// delay returns the wait the next Publish would make at the current lag.
func (p *LagThrottled) delay() time.Duration {
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

// Publish waits as long as the lag asks for (see [LagThrottled]) and then
// publishes every message with one call to the wrapped publisher.
func (p *LagThrottled) Publish(topic string, messages ...*message.Message) error {
	if d := p.delay(); d > 0 {
		p.throttled.Add(1)
		ctx, stop := messagesContext(messages)
		err := sleepCtx(ctx, d)
		stop()
		if err != nil {
			return fmt.Errorf("producer: publish throttled by consumer lag: %w", err)
		}
		p.waited.Add(int64(d))
	}
	return p.pub.Publish(topic, messages...)
}

// Close closes the wrapped publisher.
func (p *LagThrottled) Close() error { return p.pub.Close() }

// Stats returns the counters. Safe for concurrent use.
func (p *LagThrottled) Stats() Stats {
	return Stats{Throttled: p.throttled.Load(), Waited: time.Duration(p.waited.Load())}
}
