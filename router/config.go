package router

import (
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/shedding"
	"github.com/spillway-go/spillway/sizing"
)

// envVarPrefix is the prefix of every environment variable [LoadConfig] reads.
const envVarPrefix = "SPILLWAY_"

// The brokers Config.Broker can name.
const (
	brokerMemory = "memory" // Watermill's GoChannel, persistent, in process
	brokerKafka  = "kafka"  // watermill-kafka consumer groups (Sarama)
	brokerRedis  = "redis"  // Redis Streams consumer groups (redisbroker)
	brokerCustom = "custom" // any Watermill publisher and subscribers, given with WithBroker
)

// Config configures a [Router]. The zero value is valid: setDefaults fills
// every zero field, so a field left out of the YAML file and the
// environment takes the default documented on it (and in docs/router.md).
// A zero numeric field therefore means "the default", never zero.
//
// Load it with [LoadConfig] (YAML file, then SPILLWAY_* environment
// variables, which win) or build it in code. Each leaf field's YAML key is
// its yaml tag and its environment variable is SPILLWAY_ followed by the
// envPrefix tags of the enclosing structs and its env tag, e.g.
// kafka.rebalance_timeout is SPILLWAY_KAFKA_REBALANCE_TIMEOUT.
type Config struct {
	// Broker is the message broker the router runs on: memory
	// (Watermill's GoChannel, in process), kafka (watermill-kafka consumer
	// groups over Sarama), redis (Redis Streams consumer groups) or custom
	// (any Watermill publisher and subscribers, given with WithBroker,
	// which custom requires). Default memory, or custom with WithBroker.
	Broker string `yaml:"broker" env:"BROKER"`

	// ConsumerGroup prefixes every handler's consumer group on Kafka and
	// on Redis: handler h consumes in group "<consumer_group>.<h>".
	// kafka.consumer_group or
	// redis.consumer_group, when set, overrides it for that broker; set
	// this one instead, so that switching brokers keeps the group.
	// Default spillway.
	ConsumerGroup string `yaml:"consumer_group" env:"CONSUMER_GROUP"`

	// CloseTimeout bounds a graceful shutdown: how long Close waits for
	// admitted work to finish, and then for Watermill's router to stop its
	// handlers. Default 30s.
	CloseTimeout time.Duration `yaml:"close_timeout" env:"CLOSE_TIMEOUT"`

	// Budget sizes the vertex budget shared by every handler of the router.
	Budget BudgetConfig `yaml:"budget" envPrefix:"BUDGET_"`

	// Shedding is the load-shedding policy (docs/shedding.md). It is on
	// as soon as shedding.topics lists a sheddable topic; with no topics
	// nothing is ever shed and the layer is left out of the stack.
	Shedding SheddingConfig `yaml:"shedding" envPrefix:"SHEDDING_"`

	// Retry configures the retry gate (docs/retries.md). On by default:
	// a failed handler is retried a bounded number of times with backoff
	// and then dead-lettered, and a payload that cannot be decoded is
	// dead-lettered at once. retry.disabled turns it off.
	Retry RetryConfig `yaml:"retry" envPrefix:"RETRY_"`

	// Kafka configures broker: kafka. Its yaml and env tags are the
	// section's keys (kafka.rebalance_timeout,
	// SPILLWAY_KAFKA_REBALANCE_TIMEOUT). Every default is chosen for
	// backpressure; docs/kafka.md explains each one. kafka.consumer_group
	// defaults to the top-level consumer_group.
	Kafka kafkabroker.Config `yaml:"kafka" envPrefix:"KAFKA_"`

	// Redis configures broker: redis. Its yaml and env tags are the
	// section's keys (redis.max_idle_time, SPILLWAY_REDIS_MAX_IDLE_TIME).
	// Zero fields take redisbroker's defaults; docs/redis.md explains each
	// one. Two settings mean something more in the router: consumer_group
	// is a prefix, each handler consuming in "<consumer_group>.<handler>"
	// (default: the top-level consumer_group), and consumer is left empty
	// by the defaults (config print shows ""), so that each subscriber
	// names itself "<hostname>-<program>" when it starts. redis.addr is
	// required with broker: redis unless [WithRedis] gives a client
	// (redisbroker.WithClient); "embedded" runs an in-process miniredis
	// (demos only). redis.password is a [spillway.Secret].
	Redis redisbroker.Config `yaml:"redis" envPrefix:"REDIS_"`

	// Telemetry configures the router's OpenTelemetry traces, metrics and
	// lag sampling (docs/operations.md). On by default: without providers
	// (router.WithTelemetry, or the OpenTelemetry globals) nothing is
	// exported and it costs little.
	Telemetry TelemetryConfig `yaml:"telemetry" envPrefix:"TELEMETRY_"`

	// Producer slows down what the application publishes through
	// Router.Publisher: a rate limit in vertices per second and a throttle
	// on consumer lag (package producer). Off by default.
	Producer ProducerConfig `yaml:"producer" envPrefix:"PRODUCER_"`

	// custom is WithBroker's broker, which New records so that
	// RedeliveryDeadline and Validate know its deadline; nil otherwise.
	custom *CustomBroker
}

// TelemetryConfig configures the router's telemetry: the tracing and
// metrics middlewares, the tracing publisher, the budget and lag
// observers and the background lag sampler.
type TelemetryConfig struct {
	// Disabled leaves every telemetry layer out: no spans, no metrics, no
	// lag sampler. Default false.
	Disabled bool `yaml:"disabled" env:"DISABLED"`

	// Name labels the router's series: the budget label of the budget
	// metrics and the source label of the lag metrics. Give each router
	// of a process its own. Default spillway.
	Name string `yaml:"name" env:"NAME"`

	// LagInterval is how often the background sampler reads the consumer
	// lag of every handler (Kafka, Redis; never per message). Default 10s.
	LagInterval time.Duration `yaml:"lag_interval" env:"LAG_INTERVAL"`

	// LagThreshold is the total lag above which the sampler reports
	// pressure (spillway.consumer.lag.saturated). Default 0: no threshold,
	// never saturated; -1 is the same.
	LagThreshold int64 `yaml:"lag_threshold" env:"LAG_THRESHOLD"`

	// LinkProducer makes each consumer span start a trace of its own,
	// with a span link to the trace context the message carries, instead
	// of continuing the producer's trace as its child. Set it when
	// producers are outside your trust boundary: their traceparent then
	// cannot join your traces, steer a parent-based sampler, or pass
	// baggage to your handlers. Default false.
	LinkProducer bool `yaml:"link_producer" env:"LINK_PRODUCER"`
}

// BudgetConfig sizes the router's [middleware.VertexBudget].
type BudgetConfig struct {
	// Vertices is the budget's capacity: how many vertices of admitted
	// work may be in flight at once. Size it so that this much work drains
	// within half of the redelivery deadline (vertices/s × deadline × 0.5;
	// [sizing.Recommend] or spillway size compute it). Default 200000.
	Vertices int64 `yaml:"vertices" env:"VERTICES"`

	// MessageLimit additionally bounds admitted messages, whatever their
	// cost. Default 0: no message limit.
	MessageLimit int64 `yaml:"message_limit" env:"MESSAGE_LIMIT"`

	// DefaultCost is the charge, in vertices, of a message whose
	// vertex_count metadata is missing or malformed. Default 0: the whole
	// budget, so an unstamped message runs alone.
	DefaultCost int64 `yaml:"default_cost" env:"DEFAULT_COST"`

	// ComputeMissing makes the estimator count the payload's vertices when
	// vertex_count is missing or malformed, instead of charging
	// DefaultCost. It costs a full parse per unstamped message.
	ComputeMissing bool `yaml:"compute_missing" env:"COMPUTE_MISSING"`

	// MaxPayloadBytes refuses a message whose payload is larger, before it
	// is priced or decoded: decoding takes memory in proportion to the
	// bytes, whatever vertex_count says. A refused message is not clamped
	// and run alone: it goes to OversizeTopic, or is dead-lettered (see
	// OversizeTopic). Default 16 MiB, or, with budget.autosize.memory_bytes,
	// the memory one process has for geometry (memory_bytes / processes −
	// prefetch_bytes) over 64 if that is less: the worst payloads decode to
	// about 64 times their bytes. -1 ([spillway.Off]) for no cap; at most
	// cost.MaxPayloadBytes (256 MiB), which nothing can decode beyond, and
	// at most that geometry memory.
	MaxPayloadBytes int64 `yaml:"max_payload_bytes" env:"MAX_PAYLOAD_BYTES"`

	// MaxMessageVertices refuses a message whose counted charge is above
	// it, like MaxPayloadBytes: the largest message that finishes alone
	// on one core within the redelivery deadline's headroom
	// (sizing.Bounds.SoloLimit, which spillway size prints). A
	// bigger message would hold a rebalance or a claim however big the
	// budget is. Default 0: no limit, a charge above the budget is clamped
	// and runs alone.
	MaxMessageVertices int64 `yaml:"max_message_vertices" env:"MAX_MESSAGE_VERTICES"`

	// OversizeTopic receives the messages MaxPayloadBytes and
	// MaxMessageVertices refuse, so that a consumer with a longer deadline
	// can process them; the original is acked. Default "": they are
	// dead-lettered instead, on retry.dead_letter_topic ("{topic}.dead_letter"),
	// whether the retry gate is on or not, with spillway_dead_letter_cause
	// "oversize".
	OversizeTopic string `yaml:"oversize_topic" env:"OVERSIZE_TOPIC"`

	// AutoSize resizes the budget online from the handlers' measured
	// throughput (docs/sizing.md). Vertices is then only the starting
	// capacity.
	AutoSize AutoSizeConfig `yaml:"autosize" envPrefix:"AUTOSIZE_"`

	// Lanes splits the budget into lanes ([middleware.Lane],
	// docs/concepts.md): each has a name, a weight, an optional reserved
	// share (reserve, below 1) and selectors (handlers, topics,
	// max_charge); the first lane that selects a message takes it, the
	// last lane the rest. FIFO within a lane, weighted fair queuing in
	// vertices across lanes. Default none: one FIFO budget. YAML only:
	// no environment variable sets it.
	Lanes []middleware.Lane `yaml:"lanes" env:"LANES"`
}

// AutoSizeConfig is the budget.autosize section: the switch, the
// auto-sizer's own settings ([sizing.Config], whose keys sit
// directly under budget.autosize), and the inputs the router computes the
// memory bound from. The budget follows min(memory bound, measured
// vertices/s × deadline × headroom), clamped to [floor, ceiling]. Zero
// fields take the defaults in docs/sizing.md; the router's differ from
// sizing's in two places:
//
//   - deadline defaults to the broker's redelivery deadline
//     ([Config.RedeliveryDeadline]: kafka.rebalance_timeout, redis.max_idle_time,
//     or the custom broker's); the memory broker has none, so it must be set
//     there.
//   - hysteresis and tail_share take -1 ([spillway.Off]) for none / off.
//
// The sizer resizes the router's budget and calls the resize hooks of
// [WithHooks].
type AutoSizeConfig struct {
	// Enabled turns auto-sizing on. Default false: the budget stays at
	// budget.vertices.
	Enabled bool `yaml:"enabled" env:"ENABLED"`

	sizing.Config `yaml:",inline"`

	// MemoryBytes, Processes, PrefetchBytes and BytesPerVertex compute the
	// memory bound when memory_bound is not set (sizing.MemoryBound):
	// (MemoryBytes / Processes − PrefetchBytes) / BytesPerVertex.
	// MemoryBytes is the memory the consumers of one container may use for
	// in-flight geometry; default 0 (not used). BytesPerVertex is required
	// with it.
	MemoryBytes int64 `yaml:"memory_bytes" env:"MEMORY_BYTES"`
	// Processes sharing MemoryBytes. Default 1.
	Processes int `yaml:"processes" env:"PROCESSES"`
	// PrefetchBytes each process's broker client buffers. Default 0.
	PrefetchBytes int64 `yaml:"prefetch_bytes" env:"PREFETCH_BYTES"`
	// BytesPerVertex is the measured memory per in-flight vertex.
	BytesPerVertex float64 `yaml:"bytes_per_vertex" env:"BYTES_PER_VERTEX"`
}

// SheddingConfig is the shedding section: the policy's own configuration
// ([shedding.Config], whose keys sit directly under shedding) plus the
// pressure signal that priority shedding waits on.
type SheddingConfig struct {
	shedding.Config `yaml:",inline"`

	// Pressure is the signal that must last shedding.priority.window
	// before low-priority messages are shed: budget (default: the vertex
	// budget saturated, every vertex in use with work waiting), lag (the
	// consumer lag above telemetry.lag_threshold, as the lag sampler reads
	// it every telemetry.lag_interval) or either (whichever has lasted
	// longer). Lag needs telemetry on and a lag threshold.
	Pressure string `yaml:"pressure" env:"PRESSURE"`
}

// The values of shedding.pressure.
const (
	pressureBudget = "budget"
	pressureLag    = "lag"
	pressureEither = "either"
)

// RetryConfig is the retry gate's section: the gate's own configuration
// ([retrygate.Config], whose keys sit directly under retry) plus the switch
// that turns it off.
//
// With the gate on (the default) every handler also consumes its topic's
// retry topic (retry.retry_topic) with the same handler and stack, and a
// message that keeps failing ends on the dead-letter topic
// (retry.dead_letter_topic) after retry.max_attempts runs. On a broker
// with a redelivery deadline, max_elapsed_time and max_interval default to
// at most a quarter and an eighth of it, so that time in the gate stays
// within the deadline.
type RetryConfig struct {
	// Disabled turns the retry gate off. A failed handler's message is
	// then nacked and redelivered by the broker without bound, as in plain
	// Watermill (Redis alone stops at redis.max_deliveries), and the router
	// logs so once when it starts. A payload that cannot be decoded
	// (cost.ErrMalformed and the other decode errors, returned by the
	// handler) is still dead-lettered at once, cause malformed. Default
	// false.
	Disabled bool `yaml:"disabled" env:"DISABLED"`

	retrygate.Config `yaml:",inline"`
}

// redacted is what a secret prints as.
const redacted = "[redacted]"

// Config defaults. docs/router.md lists them.
const (
	defaultCloseTimeout   = 30 * time.Second
	defaultBudgetVertices = 200_000
	defaultConsumerGroup  = "spillway" // consumer_group, which kafka. and redis.consumer_group default to
	defaultTelemetryName  = "spillway"

	// The auto-sizer's own defaults (sizing.Config), filled in here so
	// that the effective configuration shows them.
	defaultAutoSizeHeadroom   = 0.5
	defaultAutoSizeWindows    = 5
	defaultAutoSizeMinWindows = 3
	defaultAutoSizeHysteresis = 0.1
	defaultAutoSizeTailShare  = 0.75
)

// defaultMaxPayloadBytes is budget.max_payload_bytes' default: the
// largest real boundaries are a few MiB of GeoJSON, and a payload that
// decodes to far more memory than its bytes (thousands of empty members)
// stays within a few hundred MiB at this size.
const defaultMaxPayloadBytes = 16 << 20

// decodeBlowup is about the most memory a payload decodes to, per byte: a
// GeoJSON MultiPolygon of empty polygons measured 72. With
// budget.autosize.memory_bytes given, max_payload_bytes defaults to the
// geometry memory of one process over it, so even such a payload decodes
// within it.
const decodeBlowup = 64

// String renders c as YAML with every secret redacted. It is safe to log;
// so is %#v, which prints each secret with spillway.Secret's GoString.
func (c Config) String() string {
	out, err := yaml.Marshal(c)
	if err != nil {
		return "router.Config{<" + err.Error() + ">}"
	}
	return string(out)
}

// RedeliveryDeadline is how long a delivered but unacknowledged message may
// stay in flight before the broker hands it to someone else:
// kafka.rebalance_timeout on Kafka (when the group changes),
// redis.max_idle_time on Redis (an entry left without a keep-alive refresh
// is claimed by a peer), 0 (none) on memory. On custom the router sizes
// against CustomBroker.RedeliveryDeadline, which only WithBroker gives: a
// Config built or loaded by the application says 0. Size the budget so
// admitted work drains within half of it (vertices/s × deadline × 0.5,
// what [sizing.Recommend] computes); budget.autosize sizes against it
// unless budget.autosize.deadline is set.
func (c Config) RedeliveryDeadline() time.Duration {
	c.setDefaults()
	return c.deadline()
}

// deadline is RedeliveryDeadline of a configuration whose broker sections
// have their defaults.
func (c *Config) deadline() time.Duration {
	switch c.Broker {
	case brokerKafka:
		return c.Kafka.RebalanceTimeout
	case brokerRedis:
		return c.Redis.MaxIdleTime
	case brokerCustom:
		if c.custom != nil {
			return c.custom.RedeliveryDeadline
		}
	}
	return 0
}
