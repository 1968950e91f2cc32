package retrygate

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-go/spillway"
)

// topicPlaceholder in [Config.RetryTopic] and [Config.DeadLetterTopic] is
// replaced by the message's origin topic: the topic it was first consumed
// from, which travels in [OriginTopicKey] once a message has been deferred.
const topicPlaceholder = "{topic}"

// DeferMode says what happens to a message the gate defers.
type DeferMode string

const (
	// DeferRepublish publishes a copy of the message to the retry topic,
	// with its attempt count, deferral count and earliest retry time in
	// metadata, and acks the original. If that publish fails the original
	// is nacked instead.
	DeferRepublish DeferMode = "republish"

	// DeferNack nacks the message so the broker redelivers it. Nothing is
	// written to the message, so the attempt count survives a nack only
	// where the broker reports redeliveries ([WithRedelivery]); and
	// the broker alone paces the redelivery.
	DeferNack DeferMode = "nack"
)

// Config defaults, stated on each field too. docs/retries.md explains each.
const (
	defaultMaxAttempts     = 5
	defaultInitialInterval = 100 * time.Millisecond
	defaultMaxInterval     = 5 * time.Second
	defaultMultiplier      = 2.0
	defaultJitter          = 0.5
	defaultMaxElapsedTime  = 10 * time.Second
	defaultRetryRate       = 10.0
	defaultRetryBurst      = 10
	defaultRetryRatio      = 0.2
	defaultRetryTopic      = topicPlaceholder + ".retry"
	defaultDeadLetterTopic = topicPlaceholder + ".dead_letter"
)

// Config is the serialisable part of a retry gate's configuration, meant to
// be embedded in a larger YAML configuration. Every field's YAML key is its
// yaml tag, its environment variable suffix its env tag.
//
// The zero value is valid: a zero field takes the default documented on it,
// so zero never means "none". Fields that can be switched off say so and
// take [spillway.Off] (any negative value) for it.
//
// The runtime dependencies are not serialisable: the publisher is a
// parameter of [New], the pressure signal, classifiers and hooks are its
// options.
type Config struct {
	// MaxAttempts is how many times the handler may run for one message
	// over its whole life, counting the first run and every retry, in
	// process or after a deferral. A message that fails its last attempt
	// is dead-lettered. 1 disables retries. Default 5.
	MaxAttempts int `yaml:"max_attempts" env:"MAX_ATTEMPTS"`

	// InitialInterval is the first backoff wait. Default 100ms.
	InitialInterval time.Duration `yaml:"initial_interval" env:"INITIAL_INTERVAL"`

	// MaxInterval caps the backoff wait before jitter. Default 5s.
	MaxInterval time.Duration `yaml:"max_interval" env:"MAX_INTERVAL"`

	// Multiplier grows the wait after each failure or deferral; at least 1.
	// Default 2.
	Multiplier float64 `yaml:"multiplier" env:"MULTIPLIER"`

	// Jitter is the backoff's randomization factor, in [0, 1]: each wait is
	// drawn uniformly from interval × [1 − Jitter, 1 + Jitter]. Default
	// 0.5; spillway.Off for none.
	Jitter float64 `yaml:"jitter" env:"JITTER"`

	// MaxElapsedTime bounds how long one delivery may stay in process
	// while retrying. When the next wait would end past it, the message is
	// deferred instead, so a delivery never approaches its broker's
	// redelivery deadline (Redis MaxIdleTime, Kafka rebalance timeout):
	// keep it well below half of that deadline. Default 10s.
	MaxElapsedTime time.Duration `yaml:"max_elapsed_time" env:"MAX_ELAPSED_TIME"`

	// RetryRate is the steady refill of the retry budget, in retries per
	// second, shared by every handler the gate wraps. Default 10; spillway.Off for
	// no time-based refill (only RetryRatio earns retries); +Inf (.inf in
	// YAML) for an unlimited budget.
	RetryRate float64 `yaml:"retry_rate" env:"RETRY_RATE"`

	// RetryBurst is how many retries the time-based bucket holds when
	// full, and the most that fresh traffic can bank through RetryRatio.
	// Default 10.
	RetryBurst int `yaml:"retry_burst" env:"RETRY_BURST"`

	// RetryRatio is how many retries each fresh message earns: 0.2 lets
	// retries add at most 20 % to the fresh load (beyond RetryRate).
	// Default 0.2; spillway.Off for none.
	RetryRatio float64 `yaml:"retry_ratio" env:"RETRY_RATIO"`

	// SaturatedAfter is how long the pressure signal must have reported
	// saturation without a break before the gate treats the consumer as
	// saturated. Default 0: any saturation counts.
	SaturatedAfter time.Duration `yaml:"saturated_after" env:"SATURATED_AFTER"`

	// Defer is republish or nack: what deferring a message means. Default
	// republish.
	Defer DeferMode `yaml:"defer" env:"DEFER"`

	// RetryTopic receives deferred messages (Defer: republish). "{topic}"
	// is replaced by the message's origin topic, giving one retry topic
	// per consumed topic; the router must consume each with the same
	// middleware stack as its origin. Default "{topic}.retry". The origin
	// a message names in its metadata is believed only on the retry topic
	// it maps to, so without "{topic}" (one retry topic for all) any
	// message on that shared topic may name its origin.
	RetryTopic string `yaml:"retry_topic" env:"RETRY_TOPIC"`

	// DeadLetterTopic receives messages that failed for good, with
	// Watermill PoisonQueue metadata. "{topic}" is replaced by the origin
	// topic. Default "{topic}.dead_letter".
	DeadLetterTopic string `yaml:"dead_letter_topic" env:"DEAD_LETTER_TOPIC"`
}

func (c *Config) setDefaults() {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = defaultMaxAttempts
	}
	if c.InitialInterval == 0 {
		c.InitialInterval = defaultInitialInterval
	}
	if c.MaxInterval == 0 {
		c.MaxInterval = defaultMaxInterval
	}
	if c.Multiplier == 0 {
		c.Multiplier = defaultMultiplier
	}
	if c.Jitter == 0 {
		c.Jitter = defaultJitter
	}
	if c.MaxElapsedTime == 0 {
		c.MaxElapsedTime = defaultMaxElapsedTime
	}
	if c.RetryRate == 0 {
		c.RetryRate = defaultRetryRate
	}
	if c.RetryBurst == 0 {
		c.RetryBurst = defaultRetryBurst
	}
	if c.RetryRatio == 0 {
		c.RetryRatio = defaultRetryRatio
	}
	if c.Defer == "" {
		c.Defer = DeferRepublish
	}
	if c.RetryTopic == "" {
		c.RetryTopic = defaultRetryTopic
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = defaultDeadLetterTopic
	}
}

// WithDefaults returns c with every zero field set to its default, as [New]
// uses it. The router reads it to fit the retry section's defaults to its
// broker's redelivery deadline and to show the effective values.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

// Validate reports every invalid field of c after defaults are applied, so
// zero fields are fine. The error joins one [*spillway.FieldError] per problem; use
// errors.As to inspect them.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &spillway.FieldError{Field: field, Value: value, Reason: reason})
	}
	ftoa := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

	if c.MaxAttempts < 0 {
		bad("max_attempts", strconv.Itoa(c.MaxAttempts), "must be positive")
	}
	if c.InitialInterval < 0 {
		bad("initial_interval", c.InitialInterval.String(), "must be positive")
	}
	if c.MaxInterval < 0 {
		bad("max_interval", c.MaxInterval.String(), "must be positive")
	} else if c.InitialInterval > c.MaxInterval {
		bad("max_interval", c.MaxInterval.String(), "must not be below initial_interval ("+c.InitialInterval.String()+")")
	}
	if math.IsNaN(c.Multiplier) || math.IsInf(c.Multiplier, 0) || c.Multiplier < 1 {
		bad("multiplier", ftoa(c.Multiplier), "must be a finite number of at least 1")
	}
	if math.IsNaN(c.Jitter) || c.Jitter > 1 || (c.Jitter < 0 && c.Jitter != spillway.Off) {
		bad("jitter", ftoa(c.Jitter), "must be between 0 and 1, or -1 (off)")
	}
	if c.MaxElapsedTime < 0 {
		bad("max_elapsed_time", c.MaxElapsedTime.String(), "must be positive")
	}
	if math.IsNaN(c.RetryRate) || (c.RetryRate < 0 && c.RetryRate != spillway.Off) {
		bad("retry_rate", ftoa(c.RetryRate), "must be positive, .inf (unlimited) or -1 (off)")
	}
	if c.RetryBurst < 0 {
		bad("retry_burst", strconv.Itoa(c.RetryBurst), "must be positive")
	}
	if math.IsNaN(c.RetryRatio) || math.IsInf(c.RetryRatio, 0) || (c.RetryRatio < 0 && c.RetryRatio != spillway.Off) {
		bad("retry_ratio", ftoa(c.RetryRatio), "must be a finite positive number or -1 (off)")
	}
	if c.SaturatedAfter < 0 {
		bad("saturated_after", c.SaturatedAfter.String(), "must be zero (any saturation) or positive")
	}
	switch c.Defer {
	case DeferRepublish, DeferNack:
	default:
		bad("defer", string(c.Defer), "must be republish or nack")
	}
	if strings.TrimSpace(c.RetryTopic) == "" {
		bad("retry_topic", c.RetryTopic, "must not be blank")
	}
	if strings.TrimSpace(c.DeadLetterTopic) == "" {
		bad("dead_letter_topic", c.DeadLetterTopic, "must not be blank")
	} else if c.Defer == DeferRepublish && c.DeadLetterTopic == c.RetryTopic {
		bad("dead_letter_topic", c.DeadLetterTopic, "must differ from retry_topic")
	}
	return errors.Join(errs...)
}

// RetryTopicFor returns the retry topic of messages that originate from
// topic. The router uses it to subscribe the retry topic of each handler
// topic with the same middleware stack.
func (c Config) RetryTopicFor(topic string) string {
	c.setDefaults()
	return strings.ReplaceAll(c.RetryTopic, topicPlaceholder, topic)
}

// DeadLetterTopicFor returns the dead-letter topic of messages that
// originate from topic.
func (c Config) DeadLetterTopicFor(topic string) string {
	c.setDefaults()
	return strings.ReplaceAll(c.DeadLetterTopic, topicPlaceholder, topic)
}
