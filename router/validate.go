package router

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/embedreg"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/sizing"
)

func (c *Config) setDefaults() {
	if c.Broker == "" {
		c.Broker = brokerMemory
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = defaultCloseTimeout
	}
	if c.ConsumerGroup == "" {
		c.ConsumerGroup = defaultConsumerGroup
	}
	// The broker sections' groups, unless set, follow the top-level one.
	if c.Kafka.ConsumerGroup == "" {
		c.Kafka.ConsumerGroup = c.ConsumerGroup
	}
	if c.Redis.ConsumerGroup == "" {
		c.Redis.ConsumerGroup = c.ConsumerGroup
	}
	if c.Budget.Vertices == 0 {
		c.Budget.Vertices = defaultBudgetVertices
	}
	a := &c.Budget.AutoSize
	if a.Headroom == 0 {
		a.Headroom = defaultAutoSizeHeadroom
	}
	if a.Processes == 0 {
		a.Processes = 1
	}
	if c.Budget.MaxPayloadBytes == 0 {
		c.Budget.MaxPayloadBytes = defaultMaxPayloadBytes
		if g := a.geometryBytes(); g > 0 {
			c.Budget.MaxPayloadBytes = max(min(defaultMaxPayloadBytes, g/decodeBlowup), 1)
		}
	}
	if a.Floor == 0 {
		a.Floor = 1
	}
	if a.Windows == 0 {
		a.Windows = defaultAutoSizeWindows
	}
	if a.MinWindows == 0 {
		a.MinWindows = min(defaultAutoSizeMinWindows, a.Windows)
	}
	if a.Hysteresis == 0 {
		a.Hysteresis = defaultAutoSizeHysteresis
	}
	if a.TailShare == 0 {
		a.TailShare = defaultAutoSizeTailShare
	}
	c.Shedding.Config = c.Shedding.Config.WithDefaults()
	if c.Shedding.Pressure == "" {
		c.Shedding.Pressure = pressureBudget
	}
	c.Kafka = c.Kafka.WithDefaults()
	if c.Redis.Window == 0 {
		c.Redis.Window = redisLaneWindow(c.Budget.Lanes)
	}
	setRedisDefaults(&c.Redis)
	if c.Broker == brokerKafka && c.Kafka.Consumer == kafkabroker.ConsumerKey && c.Retry.Defer == "" {
		// A republished copy would run after later messages of its
		// key; a nacked message is sent again in its place.
		c.Retry.Defer = retrygate.DeferNack
	}
	c.Retry.Config = retryDefaults(c.Retry.Config, c.deadline())
	t := &c.Telemetry
	if t.Name == "" {
		t.Name = defaultTelemetryName
	}
	if t.LagInterval == 0 {
		t.LagInterval = 10 * time.Second // the lag sampler's own default
	}
	c.Producer.setDefaults()
}

// retryDefaults fills the retry section. Under a redelivery deadline d,
// the gate's time bounds default to fit within it: max_elapsed_time to at
// most d/4 and max_interval to at most d/8, so that retrying in process
// plus holding an early retry (min(2 × max_interval, max_elapsed_time))
// takes at most half of d; initial_interval to at most max_interval.
// Values set explicitly are kept (and Validate checks them against d).
func retryDefaults(r retrygate.Config, d time.Duration) retrygate.Config {
	if d > 0 {
		def := retrygate.Config{}.WithDefaults()
		if r.MaxElapsedTime == 0 {
			r.MaxElapsedTime = max(1, min(def.MaxElapsedTime, d/4))
		}
		if r.MaxInterval == 0 {
			r.MaxInterval = max(1, min(def.MaxInterval, d/8))
		}
		if r.InitialInterval == 0 {
			r.InitialInterval = min(def.InitialInterval, r.MaxInterval)
		}
	}
	return r.WithDefaults()
}

// setRedisDefaults fills the redis section: redisbroker's defaults, with
// the consumer name left for each subscriber to choose when it starts.
// setDefaults gives it the router's consumer group first.
func setRedisDefaults(r *redisbroker.Config) {
	consumer := r.Consumer
	*r = r.WithDefaults()
	r.Consumer = consumer
}

// Validate reports every invalid field of c (after defaults are applied,
// so zero fields are fine). Of the broker sections only the chosen
// broker's is checked; the budget, shedding and retry sections are always
// checked, also while switched off, so a bad value does not wait for the
// day it is switched on. Values that are only wrong together (retries
// against the shedding window or the redelivery deadline, features the
// broker cannot use) are checked when the features are on. The error
// joins one [*spillway.FieldError] per problem; a field of an embedded section is
// named by its full path, e.g. shedding.priority.window or
// retry.max_attempts.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &spillway.FieldError{Field: field, Value: value, Reason: reason})
	}
	switch c.Broker {
	case brokerMemory, brokerKafka, brokerRedis, brokerCustom:
	default:
		bad("broker", c.Broker, "must be one of memory, kafka, redis, custom")
	}
	if c.CloseTimeout < 0 {
		bad("close_timeout", c.CloseTimeout.String(), "must be positive")
	}
	if strings.TrimSpace(c.ConsumerGroup) == "" {
		bad("consumer_group", c.ConsumerGroup, "must not be blank")
	}
	if c.Budget.Vertices < 0 {
		bad("budget.vertices", strconv.FormatInt(c.Budget.Vertices, 10), "must be positive")
	}
	if c.Budget.MessageLimit < 0 {
		bad("budget.message_limit", strconv.FormatInt(c.Budget.MessageLimit, 10), "must be zero (no limit) or positive")
	}
	if c.Budget.Vertices > 0 {
		// The budget checks its capacity's upper bound.
		if _, err := middleware.NewVertexBudget(c.Budget.Vertices); err != nil {
			if fe := (*spillway.FieldError)(nil); errors.As(err, &fe) {
				bad("budget.vertices", fe.Value, fe.Reason)
			}
		}
	}
	if b := c.Budget.MaxPayloadBytes; b < spillway.Off || b > cost.MaxPayloadBytes {
		bad("budget.max_payload_bytes", strconv.FormatInt(b, 10), fmt.Sprintf("must be -1 (no cap) or positive, at most %d", cost.MaxPayloadBytes))
	}
	if b, g := c.Budget.MaxPayloadBytes, c.Budget.AutoSize.geometryBytes(); g > 0 && b > g {
		bad("budget.max_payload_bytes", strconv.FormatInt(b, 10), fmt.Sprintf("must not exceed the memory one process has for geometry (%d bytes, from budget.autosize.memory_bytes)", g))
	}
	if c.Budget.MaxMessageVertices < 0 {
		bad("budget.max_message_vertices", strconv.FormatInt(c.Budget.MaxMessageVertices, 10), "must be zero (no limit) or positive")
	}
	if t := c.Budget.OversizeTopic; t != "" && strings.TrimSpace(t) == "" {
		bad("budget.oversize_topic", t, "must not be blank")
	}
	if len(c.Budget.Lanes) > 0 {
		// The budget checks its lanes; any valid capacity will do.
		if _, err := middleware.NewVertexBudget(1, middleware.WithLanes(c.Budget.Lanes...)); err != nil {
			if fe := (*spillway.FieldError)(nil); errors.As(err, &fe) {
				bad("budget."+fe.Field, fe.Value, fe.Reason)
			}
		}
	}
	if c.Budget.DefaultCost < 0 {
		bad("budget.default_cost", strconv.FormatInt(c.Budget.DefaultCost, 10), "must be zero (the whole budget) or positive")
	}
	deadline := c.autoSizeDeadline()
	if deadline == 0 && c.Broker == brokerCustom && c.custom == nil {
		deadline = -1 // WithBroker gives it: unknown until New, which validates again
	}
	errs = append(errs, c.Budget.AutoSize.validate(deadline)...)
	errs = append(errs, nested("shedding.", c.Shedding.Config.Validate())...)
	errs = append(errs, nested("retry.", c.Retry.Config.Validate())...)
	errs = append(errs, c.validateCombinations()...)
	switch c.Broker {
	case brokerKafka:
		errs = append(errs, nested("kafka.", c.Kafka.Validate())...)
	case brokerRedis:
		errs = append(errs, validateRedis(c.Redis)...)
	}
	errs = append(errs, c.Telemetry.validate()...)
	errs = append(errs, c.Producer.validate(c)...)
	return errors.Join(errs...)
}

// validateCombinations checks the values that are only wrong together:
// shedding and retries against each other and against the broker.
func (c Config) validateCombinations() []error {
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &spillway.FieldError{Field: field, Value: value, Reason: reason})
	}
	switch p := c.Shedding.Pressure; p {
	case "", pressureBudget:
	case pressureLag, pressureEither:
		if c.Telemetry.Disabled || c.Telemetry.LagThreshold <= 0 {
			bad("shedding.pressure", p, "needs the lag sampler: telemetry on and telemetry.lag_threshold above 0")
		}
	default:
		bad("shedding.pressure", p, "must be budget, lag or either")
	}
	if c.Broker == brokerKafka && c.Shedding.Coalesce.Enabled {
		bad("shedding.coalesce.enabled", "true", "must be false on kafka: a partition has one message in flight, so there is never anything to coalesce, "+
			"and it costs a goroutine per message (use shedding.version_guard)")
	}
	if c.Retry.Disabled {
		return errs
	}
	r := c.Retry.Config
	if c.Broker == brokerKafka && c.Kafka.Consumer == kafkabroker.ConsumerKey && r.Defer == retrygate.DeferRepublish {
		bad("retry.defer", string(r.Defer), "must be nack with kafka.consumer key (its default there): a copy republished to the retry topic "+
			"runs after later messages of its key, and key order is what kafka.consumer key is for")
	}
	if c.Broker == brokerMemory && r.Defer == retrygate.DeferNack {
		bad("retry.defer", string(r.Defer), "must be republish on memory: GoChannel resends the original message at once, "+
			"so a deferred message loses its attempt count and spins while the consumer is saturated")
	}
	if sh := c.Shedding; len(sh.Topics) > 0 && !sh.Priority.Disabled && r.SaturatedAfter >= sh.Priority.Window {
		bad("retry.saturated_after", r.SaturatedAfter.String(), "must be below shedding.priority.window ("+sh.Priority.Window.String()+
			"), so retries are deferred before fresh work is shed")
	}
	if d := c.RedeliveryDeadline(); d > 0 && r.MaxElapsedTime > 0 && r.MaxInterval > 0 {
		// Time in the gate counts against the deadline: retrying in
		// process for max_elapsed_time, and holding an early retry for
		// up to min(2 × max_interval, max_elapsed_time).
		if in := r.MaxElapsedTime + min(2*r.MaxInterval, r.MaxElapsedTime); in >= d {
			bad("retry.max_elapsed_time", r.MaxElapsedTime.String(), fmt.Sprintf(
				"plus the early-retry hold (min(2 × retry.max_interval, retry.max_elapsed_time)) keeps a delivery in the gate for up to %s, "+
					"which must stay below the redelivery deadline, %s (%s)", in, c.deadlineKey(), d))
		}
	}
	return errs
}

// deadlineKey names the configuration key of the broker's redelivery
// deadline.
func (c Config) deadlineKey() string {
	switch c.Broker {
	case brokerRedis:
		return "redis.max_idle_time"
	case brokerCustom:
		return "CustomBroker.RedeliveryDeadline"
	}
	return "kafka.rebalance_timeout"
}

// autoSizeDeadline is budget.autosize.deadline, or the broker's redelivery
// deadline when it is not set.
func (c Config) autoSizeDeadline() time.Duration {
	if c.Budget.AutoSize.Deadline != 0 {
		return c.Budget.AutoSize.Deadline
	}
	return c.RedeliveryDeadline()
}

// memoryBound is the configured memory bound in vertices: memory_bound,
// or the one computed from memory_bytes; 0 for none (or invalid inputs,
// which validate reports).
func (a AutoSizeConfig) memoryBound() int64 {
	if a.MemoryBound > 0 {
		return a.MemoryBound
	}
	if a.MemoryBytes > 0 && a.Processes > 0 && a.PrefetchBytes >= 0 && finitePositive(a.BytesPerVertex) {
		return sizing.MemoryBound(a.MemoryBytes, a.Processes, a.PrefetchBytes, a.BytesPerVertex)
	}
	return 0
}

// geometryBytes is the memory one process has for in-flight geometry:
// memory_bytes / processes − prefetch_bytes; 0 when memory_bytes is not
// given.
func (a AutoSizeConfig) geometryBytes() int64 {
	if a.MemoryBytes <= 0 || a.Processes <= 0 {
		return 0
	}
	return max(a.MemoryBytes/int64(a.Processes)-a.PrefetchBytes, 0)
}

// ceiling is the largest capacity the sizer may set: ceiling, or the
// memory bound; 0 for none.
func (a AutoSizeConfig) ceiling() int64 {
	if a.Ceiling > 0 {
		return a.Ceiling
	}
	return a.memoryBound()
}

func finitePositive(f float64) bool { return f > 0 && !math.IsInf(f, 0) && !math.IsNaN(f) }

func (a AutoSizeConfig) validate(deadline time.Duration) []error {
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &spillway.FieldError{Field: "budget.autosize." + field, Value: value, Reason: reason})
	}
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	if a.Deadline < 0 {
		bad("deadline", a.Deadline.String(), "must be positive")
	}
	if math.IsNaN(a.Headroom) || a.Headroom <= 0 || a.Headroom > 1 {
		bad("headroom", ftoa(a.Headroom), "must be above 0 and at most 1")
	}
	if a.MemoryBound < 0 {
		bad("memory_bound", itoa(a.MemoryBound), "must be zero (none) or positive")
	}
	if a.MemoryBytes < 0 {
		bad("memory_bytes", itoa(a.MemoryBytes), "must be zero (not used) or positive")
	}
	if a.Processes < 0 {
		bad("processes", strconv.Itoa(a.Processes), "must be positive")
	}
	if a.PrefetchBytes < 0 {
		bad("prefetch_bytes", itoa(a.PrefetchBytes), "must be zero or positive")
	}
	if a.BytesPerVertex != 0 && !finitePositive(a.BytesPerVertex) {
		bad("bytes_per_vertex", ftoa(a.BytesPerVertex), "must be a positive number")
	}
	if a.MemoryBytes > 0 {
		switch {
		case a.MemoryBound > 0:
			bad("memory_bytes", itoa(a.MemoryBytes), "set either budget.autosize.memory_bound or memory_bytes, not both")
		case a.BytesPerVertex == 0:
			bad("bytes_per_vertex", "0", "must be set with budget.autosize.memory_bytes")
		case a.memoryBound() < 1 && a.Processes > 0 && a.PrefetchBytes >= 0 && finitePositive(a.BytesPerVertex):
			bad("memory_bytes", itoa(a.MemoryBytes), fmt.Sprintf("leaves no room for a single vertex (processes %d, prefetch_bytes %d, bytes_per_vertex %s)",
				a.Processes, a.PrefetchBytes, ftoa(a.BytesPerVertex)))
		}
	}
	if a.Floor < 0 {
		bad("floor", itoa(a.Floor), "must be positive")
	}
	if a.Ceiling < 0 {
		bad("ceiling", itoa(a.Ceiling), "must be zero (the memory bound) or positive")
	}
	if ceil := a.ceiling(); ceil > 0 && a.Floor > ceil {
		if a.Ceiling > 0 {
			bad("floor", itoa(a.Floor), fmt.Sprintf("must not be above budget.autosize.ceiling (%d)", ceil))
		} else {
			bad("floor", itoa(a.Floor), fmt.Sprintf("must not be above the memory bound (%d vertices)", ceil))
		}
	}
	if a.Window < 0 {
		bad("window", a.Window.String(), "must be positive")
	}
	if a.Windows < 0 {
		bad("windows", strconv.Itoa(a.Windows), "must be positive")
	}
	if a.MinWindows < 0 {
		bad("min_windows", strconv.Itoa(a.MinWindows), "must be positive")
	} else if a.Windows > 0 && a.MinWindows > a.Windows {
		bad("min_windows", strconv.Itoa(a.MinWindows), fmt.Sprintf("must not exceed budget.autosize.windows (%d)", a.Windows))
	}
	if a.MinBusy < 0 {
		bad("min_busy", a.MinBusy.String(), "must be zero (window / 20) or positive")
	}
	if math.IsNaN(a.Hysteresis) || a.Hysteresis >= 1 || (a.Hysteresis < 0 && a.Hysteresis != spillway.Off) {
		bad("hysteresis", ftoa(a.Hysteresis), "must be at least 0 and below 1, or -1 (none)")
	}
	if a.Parallelism < 0 {
		bad("parallelism", strconv.Itoa(a.Parallelism), "must be zero (GOMAXPROCS) or positive")
	}
	if math.IsNaN(a.TailShare) || a.TailShare > 1 || (a.TailShare <= 0 && a.TailShare != spillway.Off) {
		bad("tail_share", ftoa(a.TailShare), "must be in (0, 1], or -1 (off)")
	}
	if !a.Enabled {
		return errs
	}
	if deadline == 0 {
		bad("deadline", "0s", "must be set: this broker has no redelivery deadline to size the budget against")
	}
	if a.ceiling() == 0 && a.MemoryBound >= 0 && a.MemoryBytes == 0 {
		bad("ceiling", "0", "must be set when there is no memory bound (budget.autosize.memory_bound or memory_bytes): nothing else stops the budget growing")
	}
	return errs
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// nested turns the joined errors of an embedded section's Validate into
// FieldErrors whose fields carry the section's prefix.
func nested(prefix string, err error) []error {
	if err == nil {
		return nil
	}
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		var fe *spillway.FieldError
		if errors.As(e, &fe) {
			out = append(out, &spillway.FieldError{Field: prefix + fe.Field, Value: fe.Value, Reason: fe.Reason, Source: fe.Source})
		} else {
			out = append(out, &spillway.FieldError{Field: strings.TrimSuffix(prefix, "."), Reason: e.Error()})
		}
	}
	return out
}

func validateRedis(r redisbroker.Config) []error {
	var errs []error
	bad := func(field, value, reason string) {
		f := "redis"
		if field != "" {
			f += "." + field
		}
		errs = append(errs, &spillway.FieldError{Field: f, Value: value, Reason: reason})
	}
	dur := func(field string, d time.Duration) {
		if d < time.Millisecond {
			bad(field, d.String(), "must be at least 1ms")
		}
	}
	switch r.Addr {
	case "":
		bad("addr", "", "must be set with broker redis (host:port, or embedded for an in-process miniredis)")
	case spillway.Embedded:
		if embedreg.Redis() == nil {
			bad("addr", r.Addr, spillway.ErrEmbeddedNotLinked.Error())
		}
	default:
		host, port, err := net.SplitHostPort(r.Addr)
		if p, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || p <= 0 || p > 65535 {
			bad("addr", r.Addr, "must be host:port or embedded")
		}
	}
	if r.DB < 0 {
		bad("db", strconv.Itoa(r.DB), "must be zero or positive")
	}
	if r.TLS.KeyFile != "" && r.TLS.KeyPEM != "" {
		bad("tls.key_pem", r.TLS.KeyPEM.String(), "set either redis.tls.key_file or redis.tls.key_pem, not both")
	}
	if hasKey := r.TLS.KeyFile != "" || r.TLS.KeyPEM != ""; (r.TLS.CertFile == "") == hasKey {
		bad("tls.cert_file", r.TLS.CertFile, "set redis.tls.cert_file and redis.tls.key_file (or key_pem) together")
	}
	if r.Addr == spillway.Embedded && (r.TLS.Enabled || r.TLS.CAFile != "" || r.TLS.CertFile != "") {
		bad("tls.enabled", "true", "must be false with the embedded server")
	}
	if strings.TrimSpace(r.ConsumerGroup) == "" {
		bad("consumer_group", r.ConsumerGroup, "must not be blank")
	}
	if strings.ContainsAny(r.Consumer, " \t\r\n") {
		bad("consumer", r.Consumer, "must not contain white space")
	}
	if r.Consumers < 1 || r.Consumers > 1024 {
		bad("consumers", strconv.Itoa(r.Consumers), "must be between 1 and 1024")
	}
	if r.Window < 1 || r.Window > 1024 {
		bad("window", strconv.Itoa(r.Window), "must be between 1 and 1024 (messages each consumer hands over at once)")
	}
	dur("block_time", r.BlockTime)
	dur("claim_interval", r.ClaimInterval)
	dur("max_idle_time", r.MaxIdleTime)
	if !r.KeepAlive.Disabled {
		// The interval defaults to a third of max_idle_time; it is left
		// zero when max_idle_time is bad, which is reported above.
		idleOK := r.MaxIdleTime >= time.Millisecond
		if r.KeepAlive.Interval < 0 || r.KeepAlive.Interval == 0 && idleOK {
			bad("keep_alive.interval", r.KeepAlive.Interval.String(), "must be positive")
		} else if idleOK && r.KeepAlive.Interval >= r.MaxIdleTime {
			bad("keep_alive.interval", r.KeepAlive.Interval.String(), "must be below redis.max_idle_time ("+r.MaxIdleTime.String()+")")
		} else if limit := (r.MaxIdleTime - r.KeepAlive.Interval) / 2; idleOK && r.BlockTime >= limit {
			bad("block_time", r.BlockTime.String(), "must be below half of redis.max_idle_time − redis.keep_alive.interval ("+
				limit.String()+"): lower it, or raise redis.max_idle_time")
		}
		if r.KeepAlive.MaxInFlight <= 0 {
			bad("keep_alive.max_in_flight", r.KeepAlive.MaxInFlight.String(), "must be positive")
		}
	}
	if r.DefaultMaxLen < 0 {
		bad("default_max_len", strconv.FormatInt(r.DefaultMaxLen, 10), "must be zero (unbounded) or positive")
	}
	for _, stream := range slices.Sorted(maps.Keys(r.MaxLen)) {
		if n := r.MaxLen[stream]; n < 0 {
			bad("max_len."+stream, strconv.FormatInt(n, 10), "must be zero (unbounded) or positive")
		}
	}
	if strings.TrimSpace(r.DeadLetterTopic) == "" {
		bad("dead_letter_topic", r.DeadLetterTopic, "must not be blank")
	}
	if len(errs) == 0 {
		// Anything the checks above missed, as redisbroker words it.
		if err := redisGroupConfig(r, "validate").Validate(); err != nil {
			bad("", "", err.Error())
		}
	}
	return errs
}

func (t TelemetryConfig) validate() []error {
	var errs []error
	if strings.TrimSpace(t.Name) == "" {
		errs = append(errs, &spillway.FieldError{Field: "telemetry.name", Value: t.Name, Reason: "must not be blank"})
	}
	if t.LagInterval < 0 {
		errs = append(errs, &spillway.FieldError{Field: "telemetry.lag_interval", Value: t.LagInterval.String(), Reason: "must be positive"})
	}
	if t.LagThreshold < spillway.Off {
		errs = append(errs, &spillway.FieldError{Field: "telemetry.lag_threshold", Value: strconv.FormatInt(t.LagThreshold, 10), Reason: "must be zero or positive (-1 or 0: no threshold)"})
	}
	return errs
}
