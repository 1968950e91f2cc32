package router

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/caarlos0/env/v11"
	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/shedding"
	"github.com/spillway-go/spillway/telemetry"
)

// EnvPrefix is the prefix of every environment variable [LoadConfig] reads.
const EnvPrefix = "SPILLWAY_"

// Embedded is the Kafka broker list entry that starts an in-process broker
// (kfake) on loopback instead of connecting to a cluster.
const Embedded = "embedded"

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

// AutoSizeConfig configures the budget's auto-sizer, a [cost.AutoSizer]:
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
	// spillway size or cost.MeasureBytesPerVertex). Default 0: none, or
	// computed from MemoryBytes. Set either this or MemoryBytes.
	MemoryBound int64 `yaml:"memory_bound" env:"MEMORY_BOUND"`

	// MemoryBytes, Processes, PrefetchBytes and BytesPerVertex compute the
	// memory bound instead (cost.MemoryBound): (MemoryBytes / Processes −
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
	// at once (cost.AutoSizeConfig.Parallelism): busy time counts the share
	// of it in use, so a budget too small to keep every core busy still
	// measures what a full one would do. Default 0: GOMAXPROCS.
	Parallelism int `yaml:"parallelism" env:"PARALLELISM"`
	// TailShare is the share of Deadline the slowest handler call of a
	// window may take before the budget shrinks for it (cost.AutoSizer's
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

// KafkaConfig configures the Kafka broker. Every default is chosen for
// backpressure; docs/kafka.md explains each one.
type KafkaConfig struct {
	// Brokers lists bootstrap brokers as host:port. The single entry
	// "embedded" starts an in-process kfake broker on loopback, owned by
	// the router and closed by Close. Default [embedded].
	Brokers []string `yaml:"brokers" env:"BROKERS"`

	// ConsumerGroup prefixes the consumer group of every handler: a
	// handler named h consumes in group "<ConsumerGroup>.<h>". Default
	// spillway.
	ConsumerGroup string `yaml:"consumer_group" env:"CONSUMER_GROUP"`

	// Topics are created up front (embedded broker, or CreateTopics set).
	// Handler topics are created when the handler is added, so this list
	// is only needed for topics that are published to but not consumed.
	Topics []string `yaml:"topics" env:"TOPICS"`

	// Partitions is the partition count of topics the router creates.
	// Default 12.
	Partitions int32 `yaml:"partitions" env:"PARTITIONS"`

	// ReplicationFactor of topics the router creates. Default 1.
	ReplicationFactor int16 `yaml:"replication_factor" env:"REPLICATION_FACTOR"`

	// CreateTopics creates missing topics on an external cluster (the
	// embedded broker always creates them). Default false.
	CreateTopics bool `yaml:"create_topics" env:"CREATE_TOPICS"`

	// KeyMetadata is the metadata field whose value becomes the Kafka
	// message key, so every message of one entity (or geocell) lands on
	// one partition and stays ordered. A message without it is keyed by
	// its UUID. Default entity_id.
	KeyMetadata string `yaml:"key_metadata" env:"KEY_METADATA"`

	// Version is the Kafka protocol version Sarama speaks: at least 0.10.1
	// (the first with a rebalance timeout). Default 2.3.0, the newest that
	// Sarama 1.43.3 and the embedded broker agree on; an external cluster
	// may use its own version.
	Version string `yaml:"version" env:"VERSION"`

	// ClientID is sent to the brokers. Default spillway.
	ClientID string `yaml:"client_id" env:"CLIENT_ID"`

	// ChannelBufferSize is Sarama's per-partition message buffer: the
	// broker window held in memory ahead of the handler. Default 16.
	ChannelBufferSize int `yaml:"channel_buffer_size" env:"CHANNEL_BUFFER_SIZE"`

	// FetchDefaultBytes is Sarama's Consumer.Fetch.Default: bytes asked for
	// per partition per fetch. Default 262144 (256 KiB).
	FetchDefaultBytes int32 `yaml:"fetch_default_bytes" env:"FETCH_DEFAULT_BYTES"`

	// RebalanceTimeout is Sarama's Consumer.Group.Rebalance.Timeout and the
	// redelivery deadline the budget is sized against: once a rebalance
	// starts, every member must release its partitions within it or be
	// evicted, and its unacknowledged messages are redelivered. Default 60s.
	RebalanceTimeout time.Duration `yaml:"rebalance_timeout" env:"REBALANCE_TIMEOUT"`

	// SessionTimeout is Consumer.Group.Session.Timeout: a member that sends
	// no heartbeat for this long is evicted. Default 10s.
	SessionTimeout time.Duration `yaml:"session_timeout" env:"SESSION_TIMEOUT"`

	// HeartbeatInterval is Consumer.Group.Heartbeat.Interval. A member
	// learns of a rebalance at its next heartbeat, so this delay is spent
	// out of RebalanceTimeout. Default 1s; must be below SessionTimeout.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval" env:"HEARTBEAT_INTERVAL"`

	// InitialOffset is where a new consumer group starts: oldest or
	// newest. Default oldest.
	InitialOffset string `yaml:"initial_offset" env:"INITIAL_OFFSET"`

	// NackResendSleep is how long watermill-kafka waits before
	// redelivering a nacked message. Default 100ms.
	NackResendSleep time.Duration `yaml:"nack_resend_sleep" env:"NACK_RESEND_SLEEP"`

	// TLS configures transport encryption.
	TLS TLSConfig `yaml:"tls" envPrefix:"TLS_"`

	// SASL configures authentication.
	SASL SASLConfig `yaml:"sasl" envPrefix:"SASL_"`
}

// TLSConfig configures TLS to the Kafka brokers.
type TLSConfig struct {
	// Enabled turns TLS on. The files below are optional: without CAFile
	// the system roots are used; without a client certificate none is sent.
	Enabled bool `yaml:"enabled" env:"ENABLED"`
	// CAFile is a PEM bundle of trusted CAs.
	CAFile string `yaml:"ca_file" env:"CA_FILE"`
	// CertFile is the PEM client certificate (mutual TLS).
	CertFile string `yaml:"cert_file" env:"CERT_FILE"`
	// KeyFile is the PEM private key of CertFile.
	KeyFile string `yaml:"key_file" env:"KEY_FILE"`
	// KeyPEM is the client private key inline, instead of KeyFile. Secret.
	KeyPEM Secret `yaml:"key_pem" env:"KEY_PEM"`
	// ServerName overrides the name checked against the broker certificate.
	ServerName string `yaml:"server_name" env:"SERVER_NAME"`
	// InsecureSkipVerify disables certificate verification. Tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify" env:"INSECURE_SKIP_VERIFY"`
}

// SASLConfig configures SASL authentication to the Kafka brokers.
type SASLConfig struct {
	// Mechanism is empty (no SASL), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string `yaml:"mechanism" env:"MECHANISM"`
	// User is the SASL user name.
	User string `yaml:"user" env:"USER"`
	// Password is the SASL password. Secret.
	Password Secret `yaml:"password" env:"PASSWORD"`
}

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
	// LagInterval is the period of each subscriber's own lag sampler.
	// Default 5s.
	LagInterval time.Duration `yaml:"lag_interval" env:"LAG_INTERVAL"`

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

// ConfigError is one invalid configuration value. The errors returned by
// [Config.Validate] and [LoadConfig] wrap one or more of them (use
// errors.As). Value is the offending value as written, or "[redacted]" for a
// secret.
type ConfigError struct {
	Field  string // the YAML path, e.g. kafka.rebalance_timeout
	Value  string // the bad value
	Reason string // what is wrong with it
	Source string // where it came from: "", a file:line, or an env var
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("router: config: ")
	b.WriteString(e.Field)
	if e.Source != "" {
		b.WriteString(" (")
		b.WriteString(e.Source)
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	b.WriteString(", got ")
	b.WriteString(strconv.Quote(e.Value))
	return b.String()
}

// Config defaults. docs/router.md lists them.
const (
	DefaultCloseTimeout      = 30 * time.Second
	DefaultBudgetVertices    = 200_000
	DefaultConsumerGroup     = "spillway"
	DefaultPartitions        = 12
	DefaultKeyMetadata       = "entity_id"
	DefaultKafkaVersion      = "2.3.0"
	DefaultClientID          = "spillway"
	DefaultChannelBufferSize = 16
	DefaultFetchDefaultBytes = 256 << 10
	DefaultRebalanceTimeout  = 60 * time.Second
	DefaultSessionTimeout    = 10 * time.Second
	DefaultHeartbeatInterval = time.Second
	DefaultNackResendSleep   = 100 * time.Millisecond
	DefaultTelemetryName     = "spillway"

	DefaultAutoSizeWindows    = 5
	DefaultAutoSizeMinWindows = 3
	DefaultAutoSizeHysteresis = 0.1
)

// Off, in a float field documented as accepting it
// (budget.autosize.hysteresis, budget.autosize.tail_share, retry.jitter, retry.retry_rate,
// retry.retry_ratio), switches that feature off; zero selects the default.
const Off = -1

func (c *Config) setDefaults() {
	if c.Broker == "" {
		c.Broker = BrokerMemory
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.Budget.Vertices == 0 {
		c.Budget.Vertices = DefaultBudgetVertices
	}
	a := &c.Budget.AutoSize
	if a.Headroom == 0 {
		a.Headroom = cost.DefaultHeadroom
	}
	if a.Processes == 0 {
		a.Processes = 1
	}
	if a.Floor == 0 {
		a.Floor = 1
	}
	if a.Windows == 0 {
		a.Windows = DefaultAutoSizeWindows
	}
	if a.MinWindows == 0 {
		a.MinWindows = min(DefaultAutoSizeMinWindows, a.Windows)
	}
	if a.Hysteresis == 0 {
		a.Hysteresis = DefaultAutoSizeHysteresis
	}
	if a.TailShare == 0 {
		a.TailShare = cost.DefaultTailShare
	}
	c.Shedding.Config = c.Shedding.Config.WithDefaults()
	if c.Shedding.Pressure == "" {
		c.Shedding.Pressure = PressureBudget
	}
	c.Retry.Config = c.Retry.Config.WithDefaults()
	k := &c.Kafka
	if len(k.Brokers) == 0 {
		k.Brokers = []string{Embedded}
	}
	if k.ConsumerGroup == "" {
		k.ConsumerGroup = DefaultConsumerGroup
	}
	if k.Partitions == 0 {
		k.Partitions = DefaultPartitions
	}
	if k.ReplicationFactor == 0 {
		k.ReplicationFactor = 1
	}
	if k.KeyMetadata == "" {
		k.KeyMetadata = DefaultKeyMetadata
	}
	if k.Version == "" {
		k.Version = DefaultKafkaVersion
	}
	if k.ClientID == "" {
		k.ClientID = DefaultClientID
	}
	if k.ChannelBufferSize == 0 {
		k.ChannelBufferSize = DefaultChannelBufferSize
	}
	if k.FetchDefaultBytes == 0 {
		k.FetchDefaultBytes = DefaultFetchDefaultBytes
	}
	if k.RebalanceTimeout == 0 {
		k.RebalanceTimeout = DefaultRebalanceTimeout
	}
	if k.SessionTimeout == 0 {
		k.SessionTimeout = DefaultSessionTimeout
	}
	if k.HeartbeatInterval == 0 {
		k.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if k.InitialOffset == "" {
		k.InitialOffset = "oldest"
	}
	if k.NackResendSleep == 0 {
		k.NackResendSleep = DefaultNackResendSleep
	}
	c.Redis.setDefaults()
	t := &c.Telemetry
	if t.Name == "" {
		t.Name = DefaultTelemetryName
	}
	if t.LagInterval == 0 {
		t.LagInterval = telemetry.DefaultLagInterval
	}
}

func (r *RedisConfig) setDefaults() {
	if r.ConsumerGroup == "" {
		r.ConsumerGroup = DefaultConsumerGroup
	}
	if r.Consumers == 0 {
		r.Consumers = redisbroker.DefaultConsumers
	}
	if r.BlockTime == 0 {
		r.BlockTime = redisbroker.DefaultBlockTime
	}
	if r.ClaimInterval == 0 {
		r.ClaimInterval = redisbroker.DefaultClaimInterval
	}
	if r.MaxIdleTime == 0 {
		r.MaxIdleTime = redisbroker.DefaultMaxIdleTime
	}
	if r.NackResendSleep == 0 {
		r.NackResendSleep = redisbroker.DefaultNackResendSleep
	}
	if r.KeepAlive.Interval == 0 {
		r.KeepAlive.Interval = r.MaxIdleTime / 3
	}
	if r.KeepAlive.MaxInFlight == 0 {
		r.KeepAlive.MaxInFlight = redisbroker.DefaultMaxInFlight
	}
	if r.LagInterval == 0 {
		r.LagInterval = redisbroker.DefaultLagInterval
	}
	if r.DeadLetterTopic == "" {
		r.DeadLetterTopic = redisbroker.DefaultDeadLetterTopic
	}
}

// WithDefaults returns c with every zero field set to its default, as
// [New] and [LoadConfig] use it.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

// Validate reports every invalid field of c (after defaults are applied,
// so zero fields are fine). Of the broker sections only the chosen
// broker's is checked; the budget, shedding and retry sections are always
// checked, also while switched off, so a bad value does not wait for the
// day it is switched on. Values that are only wrong together (retries
// against the shedding window or the redelivery deadline, features the
// broker cannot use) are checked when the features are on. The error
// joins one [*ConfigError] per problem; a field of an embedded section is
// named by its full path, e.g. shedding.priority.window or
// retry.max_attempts.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &ConfigError{Field: field, Value: value, Reason: reason})
	}
	switch c.Broker {
	case BrokerMemory, BrokerKafka, BrokerRedis:
	default:
		bad("broker", string(c.Broker), "must be one of memory, kafka, redis")
	}
	if c.CloseTimeout < 0 {
		bad("close_timeout", c.CloseTimeout.String(), "must be positive")
	}
	if c.Budget.Vertices < 0 {
		bad("budget.vertices", strconv.FormatInt(c.Budget.Vertices, 10), "must be positive")
	}
	if c.Budget.MessageLimit < 0 {
		bad("budget.message_limit", strconv.FormatInt(c.Budget.MessageLimit, 10), "must be zero (no limit) or positive")
	}
	if c.Budget.DefaultCost < 0 {
		bad("budget.default_cost", strconv.FormatInt(c.Budget.DefaultCost, 10), "must be zero (the whole budget) or positive")
	}
	errs = append(errs, c.Budget.AutoSize.validate(c.autoSizeDeadline())...)
	errs = append(errs, nested("shedding.", c.Shedding.Config.Validate())...)
	errs = append(errs, nested("retry.", c.Retry.Config.Validate())...)
	errs = append(errs, c.validateCombinations()...)
	switch c.Broker {
	case BrokerKafka:
		errs = append(errs, c.Kafka.validate()...)
	case BrokerRedis:
		errs = append(errs, c.Redis.validate()...)
	}
	errs = append(errs, c.Telemetry.validate()...)
	return errors.Join(errs...)
}

// validateCombinations checks the values that are only wrong together:
// shedding and retries against each other and against the broker.
func (c Config) validateCombinations() []error {
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &ConfigError{Field: field, Value: value, Reason: reason})
	}
	switch p := c.Shedding.Pressure; p {
	case "", PressureBudget:
	case PressureLag, PressureEither:
		if c.Telemetry.Disabled || c.Telemetry.LagThreshold <= 0 {
			bad("shedding.pressure", string(p), "needs the lag sampler: telemetry on and telemetry.lag_threshold above 0")
		}
	default:
		bad("shedding.pressure", string(p), "must be budget, lag or either")
	}
	if c.Broker == BrokerKafka && c.Shedding.Coalesce.Enabled {
		bad("shedding.coalesce.enabled", "true", "must be false on kafka: a partition has one message in flight, so there is never anything to coalesce, "+
			"and it costs a goroutine per message (use shedding.version_guard)")
	}
	if !c.Retry.Enabled {
		return errs
	}
	r := c.Retry.Config
	if c.Broker == BrokerMemory && r.Defer == retrygate.DeferNack {
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
	if c.Broker == BrokerRedis {
		return "redis.max_idle_time"
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
		return cost.MemoryBound(a.MemoryBytes, a.Processes, a.PrefetchBytes, a.BytesPerVertex)
	}
	return 0
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
		errs = append(errs, &ConfigError{Field: "budget.autosize." + field, Value: value, Reason: reason})
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
	if math.IsNaN(a.Hysteresis) || a.Hysteresis >= 1 || (a.Hysteresis < 0 && a.Hysteresis != Off) {
		bad("hysteresis", ftoa(a.Hysteresis), "must be at least 0 and below 1, or -1 (none)")
	}
	if a.Parallelism < 0 {
		bad("parallelism", strconv.Itoa(a.Parallelism), "must be zero (GOMAXPROCS) or positive")
	}
	if math.IsNaN(a.TailShare) || a.TailShare > 1 || (a.TailShare <= 0 && a.TailShare != Off) {
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
// ConfigErrors whose fields carry the section's prefix.
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
		var fe *shedding.FieldError
		var re *retrygate.ConfigError
		switch {
		case errors.As(e, &fe):
			out = append(out, &ConfigError{Field: prefix + fe.Field, Value: fe.Value, Reason: fe.Reason})
		case errors.As(e, &re):
			out = append(out, &ConfigError{Field: prefix + re.Field, Value: re.Value, Reason: re.Reason})
		default:
			out = append(out, &ConfigError{Field: strings.TrimSuffix(prefix, "."), Reason: e.Error()})
		}
	}
	return out
}

func (k KafkaConfig) validate() []error {
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &ConfigError{Field: "kafka." + field, Value: value, Reason: reason})
	}
	for i, b := range k.Brokers {
		switch {
		case b == Embedded && len(k.Brokers) > 1:
			bad(fmt.Sprintf("brokers[%d]", i), b, "embedded must be the only entry")
		case b == Embedded:
		default:
			if host, port, err := net.SplitHostPort(b); err != nil || host == "" || port == "" {
				bad(fmt.Sprintf("brokers[%d]", i), b, "must be host:port or embedded")
			}
		}
	}
	if strings.TrimSpace(k.ConsumerGroup) == "" {
		bad("consumer_group", k.ConsumerGroup, "must not be blank")
	}
	for i, t := range k.Topics {
		if strings.TrimSpace(t) == "" {
			bad(fmt.Sprintf("topics[%d]", i), t, "must not be blank")
		}
	}
	if k.Partitions < 0 {
		bad("partitions", strconv.Itoa(int(k.Partitions)), "must be positive")
	}
	if k.ReplicationFactor < 0 {
		bad("replication_factor", strconv.Itoa(int(k.ReplicationFactor)), "must be positive")
	}
	if v, err := sarama.ParseKafkaVersion(k.Version); err != nil {
		bad("version", k.Version, "must be a Kafka version such as 2.8.0")
	} else if !v.IsAtLeast(sarama.V0_10_1_0) {
		bad("version", k.Version, "must be at least 0.10.1 (the first with a rebalance timeout)")
	} else if k.embedded() && v.IsAtLeast(sarama.V2_4_0_0) {
		bad("version", k.Version, "must be at most 2.3.0 with the embedded broker (Sarama cannot decode its newer responses)")
	}
	if k.ChannelBufferSize < 0 {
		bad("channel_buffer_size", strconv.Itoa(k.ChannelBufferSize), "must be positive")
	}
	if k.FetchDefaultBytes < 0 {
		bad("fetch_default_bytes", strconv.Itoa(int(k.FetchDefaultBytes)), "must be positive")
	}
	if k.RebalanceTimeout < 0 {
		bad("rebalance_timeout", k.RebalanceTimeout.String(), "must be positive")
	} else if k.RebalanceTimeout%time.Millisecond != 0 || k.RebalanceTimeout < time.Millisecond {
		bad("rebalance_timeout", k.RebalanceTimeout.String(), "must be a whole number of milliseconds")
	}
	if k.SessionTimeout < 0 {
		bad("session_timeout", k.SessionTimeout.String(), "must be positive")
	}
	if k.HeartbeatInterval < 0 {
		bad("heartbeat_interval", k.HeartbeatInterval.String(), "must be positive")
	} else if k.SessionTimeout > 0 && k.HeartbeatInterval >= k.SessionTimeout {
		bad("heartbeat_interval", k.HeartbeatInterval.String(), "must be below kafka.session_timeout ("+k.SessionTimeout.String()+")")
	}
	switch k.InitialOffset {
	case "oldest", "newest":
	default:
		bad("initial_offset", k.InitialOffset, "must be oldest or newest")
	}
	if k.NackResendSleep < 0 {
		bad("nack_resend_sleep", k.NackResendSleep.String(), "must be zero or positive")
	}
	if k.TLS.KeyFile != "" && k.TLS.KeyPEM != "" {
		bad("tls.key_pem", k.TLS.KeyPEM.String(), "set either kafka.tls.key_file or kafka.tls.key_pem, not both")
	}
	hasKey := k.TLS.KeyFile != "" || k.TLS.KeyPEM != ""
	if k.TLS.CertFile != "" && !hasKey {
		bad("tls.cert_file", k.TLS.CertFile, "needs kafka.tls.key_file or kafka.tls.key_pem")
	}
	if k.TLS.CertFile == "" && hasKey {
		bad("tls.key_file", k.TLS.KeyFile+k.TLS.KeyPEM.String(), "needs kafka.tls.cert_file")
	}
	if !k.TLS.Enabled && (k.TLS.CAFile != "" || k.TLS.CertFile != "" || hasKey) {
		bad("tls.enabled", "false", "must be true when TLS files are set")
	}
	switch k.SASL.Mechanism {
	case "":
		if k.SASL.User != "" || k.SASL.Password != "" {
			bad("sasl.mechanism", "", "must be set (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512) when a SASL user or password is")
		}
	case sarama.SASLTypePlaintext, sarama.SASLTypeSCRAMSHA256, sarama.SASLTypeSCRAMSHA512:
		if k.SASL.User == "" {
			bad("sasl.user", "", "must be set with kafka.sasl.mechanism "+k.SASL.Mechanism)
		}
		if k.SASL.Password == "" {
			bad("sasl.password", "", "must be set with kafka.sasl.mechanism "+k.SASL.Mechanism)
		}
	default:
		bad("sasl.mechanism", k.SASL.Mechanism, "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	}
	return errs
}

func (r RedisConfig) validate() []error {
	var errs []error
	bad := func(field, value, reason string) {
		f := "redis"
		if field != "" {
			f += "." + field
		}
		errs = append(errs, &ConfigError{Field: f, Value: value, Reason: reason})
	}
	dur := func(field string, d time.Duration) {
		if d < time.Millisecond {
			bad(field, d.String(), "must be at least 1ms")
		}
	}
	switch r.Addr {
	case "":
		bad("addr", "", "must be set with broker redis (host:port, or embedded for an in-process miniredis)")
	case redisbroker.EmbeddedAddr:
	default:
		host, port, err := net.SplitHostPort(r.Addr)
		if p, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || p <= 0 || p > 65535 {
			bad("addr", r.Addr, "must be host:port or embedded")
		}
	}
	if r.DB < 0 {
		bad("db", strconv.Itoa(r.DB), "must be zero or positive")
	}
	if (r.TLS.CertFile == "") != (r.TLS.KeyFile == "") {
		bad("tls.cert_file", r.TLS.CertFile, "set redis.tls.cert_file and redis.tls.key_file together")
	}
	if r.Addr == redisbroker.EmbeddedAddr && (r.TLS.Enabled || r.TLS.CAFile != "" || r.TLS.CertFile != "") {
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
	dur("block_time", r.BlockTime)
	dur("claim_interval", r.ClaimInterval)
	dur("max_idle_time", r.MaxIdleTime)
	if !r.KeepAlive.Disabled {
		if r.KeepAlive.Interval <= 0 {
			bad("keep_alive.interval", r.KeepAlive.Interval.String(), "must be positive")
		} else if r.KeepAlive.Interval >= r.MaxIdleTime {
			bad("keep_alive.interval", r.KeepAlive.Interval.String(), "must be below redis.max_idle_time ("+r.MaxIdleTime.String()+")")
		}
		if r.KeepAlive.MaxInFlight <= 0 {
			bad("keep_alive.max_in_flight", r.KeepAlive.MaxInFlight.String(), "must be positive")
		}
	}
	if r.LagInterval <= 0 {
		bad("lag_interval", r.LagInterval.String(), "must be positive")
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
		if err := r.broker("validate").Validate(); err != nil {
			bad("", "", err.Error())
		}
	}
	return errs
}

func (t TelemetryConfig) validate() []error {
	var errs []error
	if strings.TrimSpace(t.Name) == "" {
		errs = append(errs, &ConfigError{Field: "telemetry.name", Value: t.Name, Reason: "must not be blank"})
	}
	if t.LagInterval < 0 {
		errs = append(errs, &ConfigError{Field: "telemetry.lag_interval", Value: t.LagInterval.String(), Reason: "must be positive"})
	}
	if t.LagThreshold < Off {
		errs = append(errs, &ConfigError{Field: "telemetry.lag_threshold", Value: strconv.FormatInt(t.LagThreshold, 10), Reason: "must be zero or positive (-1 or 0: no threshold)"})
	}
	return errs
}

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
// cores, the real handler): [cost.DeadlineBound] with the default headroom
// of one half, because the other half is spent noticing the rebalance (a
// heartbeat), committing and rejoining, and because throughput is
// measured, not promised. It returns at least 1.
//
// It is a shorthand for a fixed budget; [cost.Recommend] adds the memory
// bound, and budget.autosize keeps the deadline bound up to date online.
func SizeBudget(verticesPerSecond float64, deadline time.Duration) int64 {
	return max(1, cost.DeadlineBound(verticesPerSecond, deadline, cost.DefaultHeadroom))
}

// LoadConfig reads the YAML file at path (skipped when path is ""), then
// applies SPILLWAY_* environment variables on top (the environment wins),
// fills defaults and validates. Unknown YAML keys are errors. Every error
// names the field (as its YAML path), where the value came from and the
// value itself, secrets excepted.
func LoadConfig(path string) (Config, error) {
	var c Config
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("router: config: %w", err)
		}
		if err := decodeYAML(data, path, &c); err != nil {
			return Config{}, err
		}
	}
	if err := applyEnv(&c, nil); err != nil {
		return Config{}, err
	}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// leaf is one settable configuration value.
type leaf struct {
	path   string // yaml path
	env    string // full environment variable name
	secret bool
	index  []int // field index path from Config
}

// leaves lists every leaf field of Config, depth first, in field order.
// A struct embedded with yaml ",inline" adds its fields to the enclosing
// section (same YAML path, same environment prefix).
func leaves() []leaf {
	var out []leaf
	var walk func(t reflect.Type, path, envPrefix string, index []int)
	walk = func(t reflect.Type, path, envPrefix string, index []int) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			idx := append(append([]int(nil), index...), i)
			if inline(f) {
				walk(f.Type, path, envPrefix+f.Tag.Get("envPrefix"), idx)
				continue
			}
			name := yamlName(f)
			p := name
			if path != "" {
				p = path + "." + name
			}
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
				walk(f.Type, p, envPrefix+f.Tag.Get("envPrefix"), idx)
				continue
			}
			out = append(out, leaf{
				path:   p,
				env:    envPrefix + f.Tag.Get("env"),
				secret: f.Type == reflect.TypeOf(Secret("")),
				index:  idx,
			})
		}
	}
	walk(reflect.TypeOf(Config{}), "", EnvPrefix, nil)
	return out
}

func yamlName(f reflect.StructField) string { return strings.Split(f.Tag.Get("yaml"), ",")[0] }

// inline reports whether f is an embedded struct whose fields YAML reads as
// the enclosing mapping's (yaml:",inline").
func inline(f reflect.StructField) bool {
	if !f.Anonymous || f.Type.Kind() != reflect.Struct {
		return false
	}
	_, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return slices.Contains(strings.Split(opts, ","), "inline")
}

// fieldByKey finds the field of struct type t whose YAML key is key,
// looking into inline structs.
func fieldByKey(t reflect.Type, key string) ([]int, bool) {
	for j := 0; j < t.NumField(); j++ {
		f := t.Field(j)
		if inline(f) {
			if idx, ok := fieldByKey(f.Type, key); ok {
				return append([]int{j}, idx...), true
			}
			continue
		}
		if yamlName(f) == key {
			return []int{j}, true
		}
	}
	return nil, false
}

func (l leaf) show(v string) string {
	if l.secret && v != "" {
		return redacted
	}
	return v
}

// applyEnv overlays environment variables on c. environ, if non-nil,
// replaces the process environment (tests).
func applyEnv(c *Config, environ map[string]string) error {
	opts := env.Options{Prefix: EnvPrefix, Environment: environ}
	if err := env.ParseWithOptions(c, opts); err == nil {
		return nil
	}
	// env reports Go field names, which repeat across sections. Attribute
	// each failure by parsing the variables that are set one at a time.
	if environ == nil {
		environ = env.ToMap(os.Environ())
	}
	var errs []error
	for _, l := range leaves() {
		v, ok := environ[l.env]
		if !ok {
			continue
		}
		var probe Config
		err := env.ParseWithOptions(&probe, env.Options{Prefix: EnvPrefix, Environment: map[string]string{l.env: v}})
		if err == nil {
			continue
		}
		reason := "cannot parse"
		var pe env.ParseError
		if errors.As(err, &pe) && !l.secret {
			reason = "cannot parse: " + pe.Err.Error()
		}
		errs = append(errs, &ConfigError{Field: l.path, Value: l.show(v), Reason: reason, Source: "env " + l.env})
	}
	if len(errs) == 0 {
		return fmt.Errorf("router: config: environment: %w", env.ParseWithOptions(c, opts))
	}
	return errors.Join(errs...)
}

// decodeYAML decodes data into c field by field so that every error names
// the field's path and line.
func decodeYAML(data []byte, file string, c *Config) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("router: config: %s: %w", file, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	var errs []error
	decodeNode(doc.Content[0], reflect.ValueOf(c).Elem(), "", file, &errs)
	return errors.Join(errs...)
}

func decodeNode(n *yaml.Node, v reflect.Value, path, file string, errs *[]error) {
	at := func(n *yaml.Node) string { return fmt.Sprintf("%s:%d", file, n.Line) }
	if v.Kind() != reflect.Struct || v.Type() == reflect.TypeOf(time.Duration(0)) {
		if err := n.Decode(v.Addr().Interface()); err != nil {
			value := n.Value
			if n.Kind != yaml.ScalarNode {
				value = "<" + kindName(n.Kind) + ">"
			}
			if v.Type() == reflect.TypeOf(Secret("")) && value != "" {
				value = redacted
			}
			*errs = append(*errs, &ConfigError{Field: path, Value: value, Reason: "cannot be read as " + typeName(v.Type()), Source: at(n)})
		}
		return
	}
	if n.Kind != yaml.MappingNode {
		name := path
		if name == "" {
			name = "(document)"
		}
		*errs = append(*errs, &ConfigError{Field: name, Value: "<" + kindName(n.Kind) + ">", Reason: "must be a mapping", Source: at(n)})
		return
	}
	t := v.Type()
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		p := key.Value
		if path != "" {
			p = path + "." + key.Value
		}
		field, ok := fieldByKey(t, key.Value)
		if !ok {
			*errs = append(*errs, &ConfigError{Field: p, Value: key.Value, Reason: "unknown field", Source: at(key)})
			continue
		}
		decodeNode(val, v.FieldByIndex(field), p, file, errs)
	}
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "sequence"
	case yaml.AliasNode:
		return "alias"
	default:
		return "scalar"
	}
}

func typeName(t reflect.Type) string {
	switch t {
	case reflect.TypeOf(time.Duration(0)):
		return "a duration such as 30s"
	}
	switch t.Kind() {
	case reflect.Slice:
		return "a list of " + strings.TrimPrefix(typeName(t.Elem()), "a ") + "s"
	case reflect.Map:
		return "a mapping of names to " + strings.TrimPrefix(typeName(t.Elem()), "a ") + "s"
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	case reflect.Float32, reflect.Float64:
		return "a number such as 0.5 (.inf for infinity)"
	default:
		return "an integer (" + t.Kind().String() + ")"
	}
}
