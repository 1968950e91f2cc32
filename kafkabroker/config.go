package kafkabroker

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/spillway-go/spillway"
)

// Defaults. docs/kafka.md explains each one.
const (
	defaultConsumerGroup     = "spillway"
	defaultPartitions        = 12
	defaultKeyMetadata       = "entity_id"
	defaultClientID          = "spillway"
	defaultChannelBufferSize = 16
	defaultFetchDefaultBytes = 256 << 10
	defaultRebalanceTimeout  = 60 * time.Second
	defaultSessionTimeout    = 10 * time.Second
	defaultHeartbeatInterval = time.Second
	defaultNackResendSleep   = 100 * time.Millisecond
	defaultWindowMessages    = 128
	defaultWindowBytes       = 4 << 20
	// defaultVersion is the protocol version spoken to a cluster: 3.6.0,
	// which every Kafka release since 3.6 accepts.
	defaultVersion = "3.6.0"
	// batchHeadroom is what [Config.MaxMessageBytes] adds for the record
	// batch around a message (its header and the record's own framing),
	// which brokers count against a topic's max.message.bytes.
	batchHeadroom = 1 << 10
	// embeddedVersion is the default, and the newest version allowed,
	// with brokers [spillway.Embedded]: Sarama cannot decode the in-process
	// broker's newer responses.
	embeddedVersion = "2.3.0"
)

// Consumer modes, the values of Config.Consumer.
const (
	// ConsumerPartition is watermill-kafka's own consumption: one
	// unacknowledged message per partition, so the partitions a member
	// owns bound its concurrency. The default.
	ConsumerPartition = "partition"
	// ConsumerKey hands over every record of a partition's window at once,
	// one at a time per Kafka record key, so the budget rather than the
	// partition count bounds concurrency (keySubscriber).
	ConsumerKey = "key"
)

// The values of Config.IsolationLevel.
const (
	isolationReadCommitted   = "read_committed"
	isolationReadUncommitted = "read_uncommitted"
)

// Config configures the Kafka side: the brokers, the consumer groups, the
// topics Spillway creates, and the Sarama settings chosen for backpressure.
// The zero value plus Brokers is valid: every zero field takes the default
// documented on it. The yaml and env tags are the keys of the router's
// kafka section (SPILLWAY_KAFKA_<env>).
//
// Config holds secrets (kafka.tls.key_pem, kafka.sasl.password) as
// [spillway.Secret]s, which never print.
type Config struct {
	// Brokers lists bootstrap brokers as host:port. The single entry
	// [spillway.Embedded] starts an in-process broker on loopback; it needs the
	// program to import github.com/spillway-go/spillway/embedded. Required.
	Brokers []string `yaml:"brokers" env:"BROKERS"`

	// ConsumerGroup prefixes the consumer group of every handler: a
	// handler named h consumes in group "<ConsumerGroup>.<h>". Default
	// spillway.
	ConsumerGroup string `yaml:"consumer_group" env:"CONSUMER_GROUP"`

	// Topics are created up front (embedded broker, or CreateTopics set).
	// Handler topics are created when the handler is added, so this list
	// is only needed for topics that are published to but not consumed.
	Topics []string `yaml:"topics" env:"TOPICS"`

	// Partitions is the partition count of topics Spillway creates.
	// Default 12.
	Partitions int32 `yaml:"partitions" env:"PARTITIONS"`

	// ReplicationFactor of topics Spillway creates. Default 1; on an
	// external cluster a topic with a single replica is logged as a
	// warning (copies published there are lost with its broker).
	ReplicationFactor int16 `yaml:"replication_factor" env:"REPLICATION_FACTOR"`

	// CreateTopics creates missing topics on an external cluster (the
	// embedded broker always creates them). Default false.
	CreateTopics bool `yaml:"create_topics" env:"CREATE_TOPICS"`

	// KeyMetadata is the metadata field whose value becomes the Kafka
	// message key, so every message of one entity (or geocell) lands on
	// one partition and stays ordered. A message without it is keyed by
	// its UUID, or without a UUID by a random key. Default entity_id.
	KeyMetadata string `yaml:"key_metadata" env:"KEY_METADATA"`

	// Partitioner chooses the partition of a keyed message: murmur2
	// (Kafka's Java client, Kafka Streams, Kafka Connect, and librdkafka
	// with partitioner=murmur2_random), crc32 (librdkafka's default and
	// kcat's), or hash (Sarama's default, FNV-1a). A key keeps its order
	// only if every producer of a topic places it alike (docs/kafka.md,
	// "Mixing clients"). Default murmur2.
	Partitioner string `yaml:"partitioner" env:"PARTITIONER"`

	// Version is the Kafka protocol version Sarama speaks: at least 0.10.1
	// (the first with a rebalance timeout). Default 3.6.0, or 2.3.0 with
	// brokers [spillway.Embedded] (also the most the embedded broker
	// accepts). The default is chosen when defaults are applied, so set
	// Brokers first.
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

	// MaxMessageBytes is the largest message Spillway produces and
	// consumes, as Sarama measures it (key, value, headers): Sarama's
	// Producer.MaxMessageBytes, and, with 1 KiB added for the
	// record batch around it, the consumer's Fetch.Max and the
	// max.message.bytes of topics Spillway creates. The cluster's
	// message.max.bytes, replica.fetch.max.bytes, and the max.message.bytes
	// of topics created elsewhere must allow it too. Default 0: Sarama's and
	// the cluster's own limits (about 1 MB).
	MaxMessageBytes int32 `yaml:"max_message_bytes" env:"MAX_MESSAGE_BYTES"`

	// InitialOffset is where a new consumer group starts: oldest or
	// newest. Default oldest.
	InitialOffset string `yaml:"initial_offset" env:"INITIAL_OFFSET"`

	// IsolationLevel is what consumers read of transactional producers'
	// records: read_committed (records of committed transactions, and
	// every non-transactional record; records of aborted or still open
	// transactions are never handed to a handler) or read_uncommitted
	// (every record, aborted ones included). Lag is measured the same way.
	// Default read_committed, which needs version 0.11.0 or later.
	IsolationLevel string `yaml:"isolation_level" env:"ISOLATION_LEVEL"`

	// NackResendSleep is how long watermill-kafka waits before
	// redelivering a nacked message. Default 100ms.
	NackResendSleep time.Duration `yaml:"nack_resend_sleep" env:"NACK_RESEND_SLEEP"`

	// Consumer is how handlers consume: partition (watermill-kafka, one
	// message in flight per partition) or key (a keySubscriber: messages
	// of different keys in flight together, each key in offset order,
	// within a per-partition window). Default partition.
	Consumer string `yaml:"consumer" env:"CONSUMER"`

	// WindowMessages bounds, with consumer key, the records of one
	// partition read but not yet finished: handed over, or waiting behind
	// their key. No record enters the window while it is full, or while
	// eight times as many records are read and not yet committed (the
	// span: finished behind an unfinished one included), the most a
	// crashed member's successor processes twice. Records read wait for
	// room in a read-ahead of 32 times as many records (and WindowBytes);
	// reading the partition pauses while the read-ahead is full and
	// resumes when it is half empty. Default 128.
	WindowMessages int `yaml:"window_messages" env:"WINDOW_MESSAGES"`

	// WindowBytes bounds the records of the window in bytes (key, value
	// and headers), and those of the read-ahead. A record larger than the
	// whole window is admitted alone.
	// Default 4194304 (4 MiB).
	WindowBytes int `yaml:"window_bytes" env:"WINDOW_BYTES"`

	// TLS configures transport encryption to the brokers. It is off
	// unless Enabled is true, which it must be when a file is set. The
	// client key is KeyFile or KeyPEM, not both. Without CAFile the system
	// roots are used; without a client certificate none is sent.
	TLS spillway.TLSConfig `yaml:"tls" envPrefix:"TLS_"`

	// SASL configures authentication.
	SASL SASLConfig `yaml:"sasl" envPrefix:"SASL_"`
}

// SASLConfig configures SASL authentication to the Kafka brokers.
type SASLConfig struct {
	// Mechanism is empty (no SASL), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string `yaml:"mechanism" env:"MECHANISM"`
	// User is the SASL user name.
	User string `yaml:"user" env:"USER"`
	// Password is the SASL password. Secret.
	Password spillway.Secret `yaml:"password" env:"PASSWORD"`
}

// batchLimit is MaxMessageBytes plus the batch headroom, 0 when unset.
func (c Config) batchLimit() int32 {
	if c.MaxMessageBytes <= 0 {
		return 0
	}
	return c.MaxMessageBytes + batchHeadroom
}

// embedded reports whether c asks for the in-process broker.
func (c Config) embedded() bool {
	return len(c.Brokers) == 1 && c.Brokers[0] == spillway.Embedded
}

func (c *Config) setDefaults() {
	if c.ConsumerGroup == "" {
		c.ConsumerGroup = defaultConsumerGroup
	}
	if c.Partitions == 0 {
		c.Partitions = defaultPartitions
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = 1
	}
	if c.KeyMetadata == "" {
		c.KeyMetadata = defaultKeyMetadata
	}
	if c.Partitioner == "" {
		c.Partitioner = defaultPartitioner
	}
	if c.Version == "" {
		c.Version = defaultVersion
		if c.embedded() {
			c.Version = embeddedVersion
		}
	}
	if c.ClientID == "" {
		c.ClientID = defaultClientID
	}
	if c.ChannelBufferSize == 0 {
		c.ChannelBufferSize = defaultChannelBufferSize
	}
	if c.FetchDefaultBytes == 0 {
		c.FetchDefaultBytes = defaultFetchDefaultBytes
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = defaultRebalanceTimeout
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = defaultSessionTimeout
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = defaultHeartbeatInterval
	}
	if c.InitialOffset == "" {
		c.InitialOffset = "oldest"
	}
	if c.IsolationLevel == "" {
		c.IsolationLevel = isolationReadCommitted
	}
	if c.NackResendSleep == 0 {
		c.NackResendSleep = defaultNackResendSleep
	}
	if c.Consumer == "" {
		c.Consumer = ConsumerPartition
	}
	if c.WindowMessages == 0 {
		c.WindowMessages = defaultWindowMessages
	}
	if c.WindowBytes == 0 {
		c.WindowBytes = defaultWindowBytes
	}
}

// WithDefaults returns c with every zero field set to its default. The
// router uses it to compute the effective kafka section ([New] applies the
// defaults itself).
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

// Validate reports every invalid field of c, after defaults are applied
// (so zero fields are fine). The error joins one [*spillway.FieldError] per
// problem.
func (c Config) Validate() error {
	k := c.WithDefaults()
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &spillway.FieldError{Field: field, Value: value, Reason: reason})
	}
	if len(k.Brokers) == 0 {
		bad("brokers", "", "required: host:port of the bootstrap brokers, or embedded for an in-process broker")
	}
	for i, b := range k.Brokers {
		switch {
		case b == spillway.Embedded && len(k.Brokers) > 1:
			bad(fmt.Sprintf("brokers[%d]", i), b, "embedded must be the only entry")
		case b == spillway.Embedded:
			if !embeddedLinked() {
				bad(fmt.Sprintf("brokers[%d]", i), b, spillway.ErrEmbeddedNotLinked.Error())
			}
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
	switch k.Partitioner {
	case partitionerMurmur2, partitionerCRC32, partitionerHash:
	default:
		bad("partitioner", k.Partitioner, "must be murmur2 (Kafka's Java client), crc32 (librdkafka's default) or hash (Sarama's default)")
	}
	if v, err := sarama.ParseKafkaVersion(k.Version); err != nil {
		bad("version", k.Version, "must be a Kafka version such as 3.6.0")
	} else if !v.IsAtLeast(sarama.V0_10_1_0) {
		bad("version", k.Version, "must be at least 0.10.1 (the first with a rebalance timeout)")
	} else if k.embedded() && v.IsAtLeast(sarama.V2_4_0_0) {
		bad("version", k.Version, "must be at most "+embeddedVersion+" with the embedded broker (Sarama cannot decode its newer responses)")
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
		bad("heartbeat_interval", k.HeartbeatInterval.String(), "must be below session_timeout ("+k.SessionTimeout.String()+")")
	}
	if k.MaxMessageBytes < 0 {
		bad("max_message_bytes", strconv.Itoa(int(k.MaxMessageBytes)), "must be zero (the cluster's limit) or positive")
	} else if int64(k.MaxMessageBytes)+batchHeadroom > int64(sarama.MaxRequestSize) {
		bad("max_message_bytes", strconv.Itoa(int(k.MaxMessageBytes)), fmt.Sprintf("must leave room for the batch within Sarama's request limit (%d bytes)", sarama.MaxRequestSize))
	}
	switch k.InitialOffset {
	case "oldest", "newest":
	default:
		bad("initial_offset", k.InitialOffset, "must be oldest or newest")
	}
	switch k.IsolationLevel {
	case isolationReadCommitted:
		// Only for a version otherwise valid: a bad version is reported
		// on its own field.
		v, err := sarama.ParseKafkaVersion(k.Version)
		if err == nil && v.IsAtLeast(sarama.V0_10_1_0) && !v.IsAtLeast(sarama.V0_11_0_0) {
			bad("isolation_level", k.IsolationLevel, "(the default) needs version 0.11.0 or later, the first with transactions; raise version, or set isolation_level read_uncommitted")
		}
	case isolationReadUncommitted:
	default:
		bad("isolation_level", k.IsolationLevel, "must be read_committed or read_uncommitted")
	}
	if k.NackResendSleep < 0 {
		bad("nack_resend_sleep", k.NackResendSleep.String(), "must be zero or positive")
	}
	switch k.Consumer {
	case ConsumerPartition, ConsumerKey:
	default:
		bad("consumer", k.Consumer, "must be partition or key")
	}
	if k.WindowMessages < 0 {
		bad("window_messages", strconv.Itoa(k.WindowMessages), "must be positive")
	}
	if k.WindowBytes < 0 {
		bad("window_bytes", strconv.Itoa(k.WindowBytes), "must be positive")
	}
	if k.TLS.KeyFile != "" && k.TLS.KeyPEM != "" {
		bad("tls.key_pem", k.TLS.KeyPEM.String(), "set either tls.key_file or tls.key_pem, not both")
	}
	hasKey := k.TLS.KeyFile != "" || k.TLS.KeyPEM != ""
	if k.TLS.CertFile != "" && !hasKey {
		bad("tls.cert_file", k.TLS.CertFile, "needs tls.key_file or tls.key_pem")
	}
	if k.TLS.CertFile == "" && hasKey {
		bad("tls.key_file", k.TLS.KeyFile+k.TLS.KeyPEM.String(), "needs tls.cert_file")
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
			bad("sasl.user", "", "must be set with sasl.mechanism "+k.SASL.Mechanism)
		}
		if k.SASL.Password == "" {
			bad("sasl.password", "", "must be set with sasl.mechanism "+k.SASL.Mechanism)
		}
	default:
		bad("sasl.mechanism", k.SASL.Mechanism, "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	}
	return errors.Join(errs...)
}
