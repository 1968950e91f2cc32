package router

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/producer"
	"github.com/spillway-go/spillway/telemetry"
)

// ProducerConfig is the producer section: work-aware backpressure on what
// the application publishes through [Router.Publisher] (package producer).
// Both parts are off by default. Messages that the router publishes on
// its own (handler output, retries, dead letters, shedding audits) are
// never slowed down: holding them back would hold the deliveries they
// come from.
type ProducerConfig struct {
	// RateLimit limits Publisher to a rate in vertices per second.
	RateLimit ProducerRateLimitConfig `yaml:"rate_limit" envPrefix:"RATE_LIMIT_"`

	// LagThrottle slows Publisher down while the total consumer lag of
	// the router's handlers, as the router's lag sampler reads it every
	// telemetry.lag_interval, is above lag_throttle.threshold. It needs
	// the lag sampler: broker kafka or redis, telemetry on.
	LagThrottle producer.LagThrottleConfig `yaml:"lag_throttle" envPrefix:"LAG_THROTTLE_"`
}

// ProducerRateLimitConfig is producer.rate_limit: the part of
// [producer.RateLimitConfig] that means something behind the router's
// stamping publisher, which stamps every message with its vertex_count.
type ProducerRateLimitConfig struct {
	// VerticesPerSecond is the rate. Default 0: no rate limit.
	VerticesPerSecond float64 `yaml:"vertices_per_second" env:"VERTICES_PER_SECOND"`

	// Burst is the bucket's size in vertices, and the most one Publish
	// call is charged. Default: one second at the rate.
	Burst int64 `yaml:"burst" env:"BURST"`

	// Mode is block (default: Publish waits for the vertices) or reject
	// (Publish fails at once with an error wrapping
	// producer.ErrRateLimited).
	Mode producer.Mode `yaml:"mode" env:"MODE"`
}

func (r ProducerRateLimitConfig) config() producer.RateLimitConfig {
	return producer.RateLimitConfig{VerticesPerSecond: r.VerticesPerSecond, Burst: r.Burst, Mode: r.Mode}
}

func (p *ProducerConfig) setDefaults() {
	rl := p.RateLimit.config().WithDefaults()
	p.RateLimit = ProducerRateLimitConfig{VerticesPerSecond: rl.VerticesPerSecond, Burst: rl.Burst, Mode: rl.Mode}
	p.LagThrottle = p.LagThrottle.WithDefaults()
}

// validate checks the producer section, also while it is off, and that a
// lag throttle has a lag sampler to read.
func (p ProducerConfig) validate(c Config) []error {
	errs := nested("producer.rate_limit.", p.RateLimit.config().Validate())
	errs = append(errs, nested("producer.lag_throttle.", p.LagThrottle.Validate())...)
	if t := p.LagThrottle.Threshold; t > 0 && (c.Broker == brokerMemory || c.Telemetry.Disabled) {
		errs = append(errs, &spillway.FieldError{Field: "producer.lag_throttle.threshold", Value: fmt.Sprint(t),
			Reason: "needs the lag sampler: broker kafka or redis, and telemetry on"})
	}
	return errs
}

// buildProducer builds the publisher [Router.Publisher] returns. Without
// a producer section it is r.pub (tracing over stamping over the broker);
// with one it is a chain of its own, outermost first: tracing (so the
// producer span covers the wait), stamping (so the limits charge stamped
// counts), the lag throttle, the rate limit, the broker. It runs after
// observe, which builds the lag sampler; topts are the tracing options.
func (r *Router) buildProducer(topts []telemetry.Option) error {
	r.producerPub = r.pub
	p := r.cfg.Producer
	if p.RateLimit.VerticesPerSecond == 0 && p.LagThrottle.Threshold == 0 {
		return nil
	}
	var next message.Publisher = nopClosePublisher{r.back.publisher()}
	var err error
	if p.RateLimit.VerticesPerSecond > 0 {
		if r.rateLimited, err = producer.NewRateLimited(next, p.RateLimit.config()); err != nil {
			return fmt.Errorf("router: producer.rate_limit: %w", err)
		}
		next = r.rateLimited
	}
	if p.LagThrottle.Threshold > 0 {
		if r.lagSampler == nil {
			return fmt.Errorf("router: producer.lag_throttle: no lag sampler (broker %s, telemetry.disabled %t)", r.cfg.Broker, r.cfg.Telemetry.Disabled)
		}
		if r.lagThrottled, err = producer.NewLagThrottled(next, r.lagSampler, p.LagThrottle); err != nil {
			return fmt.Errorf("router: producer.lag_throttle: %w", err)
		}
		next = r.lagThrottled
	}
	next = cost.NewStampingPublisher(next)
	if topts != nil {
		next = telemetry.NewTracingPublisher(next, topts...)
	}
	r.producerPub = next
	return nil
}
