package router

import (
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/shedding"
	"github.com/spillway-go/spillway/sizing"
)

// EnvPrefix is the prefix of every environment variable [LoadConfig] reads.
const EnvPrefix = "SPILLWAY_"

// Embedded is the Kafka broker list entry that starts an in-process broker
// on loopback instead of connecting to a cluster; see [kafkabroker.Embedded].
const Embedded = kafkabroker.Embedded

// Broker names the message broker a [Router] runs on.
type Broker string

// The brokers a Config can name.
const (
	BrokerMemory Broker = "memory" // Watermill's GoChannel, persistent, in process
	BrokerKafka  Broker = "kafka"  // watermill-kafka consumer groups (Sarama)
	BrokerRedis  Broker = "redis"  // Redis Streams consumer groups (redisbroker)
)

// Config configures a [Router]. The zero value is valid: setDefaults fills
// every zero field, so a field left out of the YAML file and the
// environment takes the default documented on it (and in docs/router.md).
// A zero numeric field therefore means "the default", never zero.
//
// Load it with [LoadConfig] (YAML file, then SPILLWAY_* environment
// variables, which win) or build it in code. Each leaf field's YAML key is
// its yaml tag and its environment variable is EnvPrefix followed by the
// envPrefix tags of the enclosing structs and its env tag, e.g.
// kafka.rebalance_timeout is SPILLWAY_KAFKA_REBALANCE_TIMEOUT.
type Config struct {
	// Broker is memory, kafka or redis. Default memory.
	Broker Broker `yaml:"broker" env:"BROKER"`

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

	// Retry configures the retry gate (docs/retries.md). Off unless
	// retry.enabled is true: by default a failed handler's message is
	// nacked and the broker redelivers it, as in plain Watermill.
	Retry RetryConfig `yaml:"retry" envPrefix:"RETRY_"`

	// Kafka configures broker: kafka.
	Kafka KafkaConfig `yaml:"kafka" envPrefix:"KAFKA_"`

	// Redis configures broker: redis.
	Redis RedisConfig `yaml:"redis" envPrefix:"REDIS_"`

	// Telemetry configures the router's OpenTelemetry traces, metrics and
	// lag sampling (docs/operations.md). On by default: without providers
	// (router.WithTracerProvider, WithMeterProvider, or the OpenTelemetry
	// globals) nothing is exported and it costs little.
	Telemetry TelemetryConfig `yaml:"telemetry" envPrefix:"TELEMETRY_"`

	// Producer slows down what the application publishes through
	// Router.Publisher: a rate limit in vertices per second and a throttle
	// on consumer lag (package producer). Off by default.
	Producer ProducerConfig `yaml:"producer" envPrefix:"PRODUCER_"`
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
}

// BudgetConfig sizes the router's [middleware.VertexBudget].
type BudgetConfig struct {
	// Vertices is the budget's capacity: how many vertices of admitted
	// work may be in flight at once. Size it so that this much work drains
	// within half of the redelivery deadline (see [SizeBudget]). Default
	// 200000.
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

	// AutoSize resizes the budget online from the handlers' measured
	// throughput (docs/sizing.md). Vertices is then only the starting
	// capacity.
	AutoSize AutoSizeConfig `yaml:"autosize" envPrefix:"AUTOSIZE_"`
}

// AutoSizeConfig configures the budget's auto-sizer, a [sizing.AutoSizer]:
// the budget follows min(memory bound, measured vertices/s × deadline ×
// headroom), clamped to [floor, ceiling]. Zero fields take the defaults
// documented on them.
type AutoSizeConfig struct {
	// Enabled turns auto-sizing on. Default false: the budget stays at
	// budget.vertices.
	Enabled bool `yaml:"enabled" env:"ENABLED"`

	// Deadline is the redelivery deadline the budget is sized against.
	// Default: the broker's (Config.RedeliveryDeadline: kafka.rebalance_timeout
	// on Kafka). The memory broker has none, so it must be set there.
	Deadline time.Duration `yaml:"deadline" env:"DEADLINE"`

	// Headroom is the share of Deadline a full budget may take to drain,
	// in (0, 1]. Default 0.5.
	Headroom float64 `yaml:"headroom" env:"HEADROOM"`

	// MemoryBound is the memory bound in vertices, fixed (measure it with
	// spillway size or sizing.MeasureBytesPerVertex). Default 0: none, or
	// computed from MemoryBytes. Set either this or MemoryBytes.
	MemoryBound int64 `yaml:"memory_bound" env:"MEMORY_BOUND"`

	// MemoryBytes, Processes, PrefetchBytes and BytesPerVertex compute the
	// memory bound instead (sizing.MemoryBound): (MemoryBytes / Processes −
	// PrefetchBytes) / BytesPerVertex. MemoryBytes is the memory the
	// consumers of one container may use for in-flight geometry; default 0
	// (not used). BytesPerVertex is required with it.
	MemoryBytes int64 `yaml:"memory_bytes" env:"MEMORY_BYTES"`
	// Processes sharing MemoryBytes. Default 1.
	Processes int `yaml:"processes" env:"PROCESSES"`
	// PrefetchBytes each process's broker client buffers. Default 0.
	PrefetchBytes int64 `yaml:"prefetch_bytes" env:"PREFETCH_BYTES"`
	// BytesPerVertex is the measured memory per in-flight vertex.
	BytesPerVertex float64 `yaml:"bytes_per_vertex" env:"BYTES_PER_VERTEX"`

	// Floor is the smallest capacity the sizer sets. Default 1.
	Floor int64 `yaml:"floor" env:"FLOOR"`
	// Ceiling is the largest capacity the sizer sets. Default: the memory
	// bound. Without a memory bound it is required: nothing else would
	// stop the budget growing.
	Ceiling int64 `yaml:"ceiling" env:"CEILING"`

	// Window is the length of one measuring window. Default: Deadline.
	Window time.Duration `yaml:"window" env:"WINDOW"`
	// Windows is how many recent windows the throughput is the median of.
	// Default 5.
	Windows int `yaml:"windows" env:"WINDOWS"`
	// MinWindows is how many windows must be measured before the first
	// resize, at most Windows. Default 3.
	MinWindows int `yaml:"min_windows" env:"MIN_WINDOWS"`
	// MinBusy is how long handlers must have been busy in a window for it
	// to count. Default Window / 20.
	MinBusy time.Duration `yaml:"min_busy" env:"MIN_BUSY"`
	// Hysteresis is the relative change below which the budget is left
	// alone, in [0, 1). Default 0.1; -1 for none (resize on any change).
	Hysteresis float64 `yaml:"hysteresis" env:"HYSTERESIS"`
	// Parallelism is how many handler calls the process runs at full speed
	// at once (sizing.AutoSizeConfig.Parallelism): busy time counts the share
	// of it in use, so a budget too small to keep every core busy still
	// measures what a full one would do. Default 0: GOMAXPROCS.
	Parallelism int `yaml:"parallelism" env:"PARALLELISM"`
	// TailShare is the share of Deadline the slowest handler call of a
	// window may take before the budget shrinks for it (sizing.AutoSizer's
	// tail guard), in (0, 1]. Default 0.75; -1 turns the guard off.
	TailShare float64 `yaml:"tail_share" env:"TAIL_SHARE"`
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
	Pressure Pressure `yaml:"pressure" env:"PRESSURE"`
}

// Pressure names the signal behind priority shedding
// (shedding.pressure).
type Pressure string

// The values of shedding.pressure.
const (
	PressureBudget Pressure = "budget"
	PressureLag    Pressure = "lag"
	PressureEither Pressure = "either"
)

// RetryConfig is the retry gate's section: the gate's own configuration
// ([retrygate.Config], whose keys sit directly under retry) plus the switch
// that turns it on.
type RetryConfig struct {
	// Enabled turns the retry gate on. Default false: a failed handler's
	// message is nacked and redelivered by the broker. When on, every
	// handler also consumes its topic's retry topic (retry.retry_topic)
	// with the same handler and stack.
	Enabled bool `yaml:"enabled" env:"ENABLED"`

	retrygate.Config `yaml:",inline"`
}

// KafkaConfig is the kafka section: [kafkabroker.Config], whose yaml and
// env tags are the section's keys (kafka.rebalance_timeout,
// SPILLWAY_KAFKA_REBALANCE_TIMEOUT). Every default is chosen for
// backpressure; docs/kafka.md explains each one.
type KafkaConfig = kafkabroker.Config

// TLSConfig is the kafka.tls section ([kafkabroker.TLSConfig]).
type TLSConfig = kafkabroker.TLSConfig

// SASLConfig is the kafka.sasl section ([kafkabroker.SASLConfig]).
type SASLConfig = kafkabroker.SASLConfig

// RedisConfig configures the Redis Streams broker ([redisbroker]). Zero
// fields take redisbroker's defaults; docs/redis.md explains each one.
type RedisConfig struct {
	// Addr is the server's host:port. "embedded" runs an in-process
	// miniredis (demos only: it gets idle times and lag wrong). Required
	// with broker: redis.
	Addr string `yaml:"addr" env:"ADDR"`
	// Username authenticates with Password (ACL user); empty for the
	// default user.
	Username string `yaml:"username" env:"USERNAME"`
	// Password is the Redis password. Secret.
	Password Secret `yaml:"password" env:"PASSWORD"`
	// DB is the database number. Default 0.
	DB int `yaml:"db" env:"DB"`
	// TLS configures transport encryption.
	TLS RedisTLSConfig `yaml:"tls" envPrefix:"TLS_"`

	// ConsumerGroup prefixes the consumer group of every handler: a
	// handler named h consumes in group "<ConsumerGroup>.<h>". Default
	// spillway.
	ConsumerGroup string `yaml:"consumer_group" env:"CONSUMER_GROUP"`
	// Consumer is the base consumer name, unique among the live processes
	// of a group and stable across restarts. Default
	// "<hostname>-<program>".
	Consumer string `yaml:"consumer" env:"CONSUMER"`
	// Consumers is the number of consumers per handler in this process:
	// the most messages a handler holds at once. Default 4.
	Consumers int `yaml:"consumers" env:"CONSUMERS"`

	// BlockTime is how long one read waits for new entries. Default 500ms.
	BlockTime time.Duration `yaml:"block_time" env:"BLOCK_TIME"`
	// ClaimInterval is how often entries idle past MaxIdleTime are looked
	// for. Default 5s.
	ClaimInterval time.Duration `yaml:"claim_interval" env:"CLAIM_INTERVAL"`
	// MaxIdleTime is the redelivery deadline the budget is sized against:
	// an entry pending this long without a keep-alive refresh is claimed
	// by another consumer. Default 30s.
	MaxIdleTime time.Duration `yaml:"max_idle_time" env:"MAX_IDLE_TIME"`
	// NackResendSleep is the pause before a nacked message is redelivered.
	// Default 100ms; -1ns (any negative) for none.
	NackResendSleep time.Duration `yaml:"nack_resend_sleep" env:"NACK_RESEND_SLEEP"`
	// KeepAlive configures the refresh of held entries.
	KeepAlive RedisKeepAliveConfig `yaml:"keep_alive" envPrefix:"KEEP_ALIVE_"`

	// DefaultMaxLen trims every stream the router publishes to at about
	// this many entries (oldest first, read or not). Default 0: unbounded.
	DefaultMaxLen int64 `yaml:"default_max_len" env:"DEFAULT_MAX_LEN"`
	// MaxLen overrides DefaultMaxLen per stream (0: unbounded). In the
	// environment: stream:n,stream2:n2.
	MaxLen map[string]int64 `yaml:"max_len" env:"MAX_LEN"`

	// DeadLetterTopic is the stream entries that cannot be unmarshalled
	// are moved to. Default spillway.deadletter.
	DeadLetterTopic string `yaml:"dead_letter_topic" env:"DEAD_LETTER_TOPIC"`
}

// RedisTLSConfig configures TLS to the Redis server. TLS is on when
// Enabled is true or a file is set.
type RedisTLSConfig struct {
	// Enabled turns TLS on (system roots unless CAFile).
	Enabled bool `yaml:"enabled" env:"ENABLED"`
	// CAFile is a PEM bundle of trusted CAs.
	CAFile string `yaml:"ca_file" env:"CA_FILE"`
	// CertFile and KeyFile are the client certificate and key (servers
	// with tls-auth-clients yes). Set both or neither.
	CertFile string `yaml:"cert_file" env:"CERT_FILE"`
	KeyFile  string `yaml:"key_file" env:"KEY_FILE"`
	// ServerName overrides the name checked against the server
	// certificate.
	ServerName string `yaml:"server_name" env:"SERVER_NAME"`
	// InsecureSkipVerify disables certificate verification. Tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify" env:"INSECURE_SKIP_VERIFY"`
}

// RedisKeepAliveConfig configures the keep-alive of held entries
// ([redisbroker.KeepAliveConfig]).
type RedisKeepAliveConfig struct {
	// Interval is how often held entries are refreshed. Default
	// max_idle_time / 3; must be below max_idle_time.
	Interval time.Duration `yaml:"interval" env:"INTERVAL"`
	// MaxInFlight is how long a consumer may hold entries without acking
	// any before it is presumed stuck. Default 5m.
	MaxInFlight time.Duration `yaml:"max_in_flight" env:"MAX_IN_FLIGHT"`
	// Disabled turns the keep-alive off. Default false.
	Disabled bool `yaml:"disabled" env:"DISABLED"`
}

// Secret is a string that never prints: String, GoString, YAML and text
// marshalling all give "[redacted]" when it is set (and "" when it is not),
// so a Secret can sit in a struct that is logged or formatted with %v, %+v
// or %#v. Convert it with string(s) where the value is really needed.
type Secret string

const redacted = "[redacted]"

// String returns "[redacted]", or "" for an empty secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString is String, for %#v.
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// MarshalYAML writes the redacted form.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// MarshalText writes the redacted form (encoding/json uses it too).
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Config defaults. docs/router.md lists them.
const (
	DefaultCloseTimeout   = 30 * time.Second
	DefaultBudgetVertices = 200_000
	DefaultConsumerGroup  = "spillway" // redis.consumer_group; kafka's is kafkabroker.DefaultConsumerGroup
	DefaultTelemetryName  = "spillway"

	DefaultAutoSizeWindows    = 5
	DefaultAutoSizeMinWindows = 3
	DefaultAutoSizeHysteresis = 0.1
)

// String renders c as YAML with every secret redacted. It is safe to log.
func (c Config) String() string {
	out, err := yaml.Marshal(c)
	if err != nil {
		return "router.Config{<" + err.Error() + ">}"
	}
	return string(out)
}

// GoString is String, so %#v redacts too.
func (c Config) GoString() string { return c.String() }

// RedeliveryDeadline is how long a delivered but unacknowledged message may
// stay in flight before the broker hands it to someone else:
// kafka.rebalance_timeout on Kafka (when the group changes),
// redis.max_idle_time on Redis (an entry left without a keep-alive refresh
// is claimed by a peer), 0 (none) on memory. Size the budget so admitted
// work drains within half of it ([SizeBudget]); budget.autosize sizes
// against it unless budget.autosize.deadline is set.
func (c Config) RedeliveryDeadline() time.Duration {
	c.setDefaults()
	switch c.Broker {
	case BrokerKafka:
		return c.Kafka.RebalanceTimeout
	case BrokerRedis:
		return c.Redis.MaxIdleTime
	}
	return 0
}

// SizeBudget returns the vertex budget that drains within half of deadline
// at verticesPerSecond, the measured throughput of the whole consumer (all
// cores, the real handler): [sizing.DeadlineBound] with the default headroom
// of one half, because the other half is spent noticing the rebalance (a
// heartbeat), committing and rejoining, and because throughput is
// measured, not promised. It returns at least 1.
//
// It is a shorthand for a fixed budget; [sizing.Recommend] adds the memory
// bound, and budget.autosize keeps the deadline bound up to date online.
func SizeBudget(verticesPerSecond float64, deadline time.Duration) int64 {
	return max(1, sizing.DeadlineBound(verticesPerSecond, deadline, sizing.DefaultHeadroom))
}
