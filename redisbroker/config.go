package redisbroker

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
)

// errClosed is returned when a closed Publisher or Subscriber is used.
var errClosed = fmt.Errorf("redisbroker: %w", spillway.ErrClosed)

// Defaults. See docs/redis.md for the reasoning behind each.
const (
	// defaultConsumers is how many consumers (upstream subscriptions) a
	// process runs per topic. One subscription delivers one message at a
	// time, so this is also the most messages a process holds per topic.
	defaultConsumers = 4
	// defaultBlockTime is how long one XREADGROUP waits for new entries.
	// It bounds the idle polling rate (Consumers / BlockTime per topic),
	// not the latency: a read returns as soon as an entry arrives.
	defaultBlockTime = 500 * time.Millisecond
	// defaultMaxIdleTime is the redelivery deadline: an entry pending for
	// longer without a keep-alive refresh is claimed by another consumer.
	defaultMaxIdleTime = 30 * time.Second
	// defaultClaimInterval is how often each consumer looks for entries
	// idle past MaxIdleTime. A dead consumer's work is taken over within
	// MaxIdleTime + ClaimInterval.
	defaultClaimInterval = 5 * time.Second
	// defaultNackResendSleep is the pause before a nacked message is
	// delivered again (the same consumer keeps it).
	defaultNackResendSleep = 100 * time.Millisecond
	// defaultMaxInFlight is how long a consumer may hold entries without
	// acking any before the keep-alive presumes it stuck and lets its
	// entries expire, for a peer to claim.
	defaultMaxInFlight = 5 * time.Minute
	// defaultMaxDeliveries is how many times an entry may be delivered
	// before the next delivery goes to the dead-letter topic.
	defaultMaxDeliveries = 5
	// defaultDeadLetterTopic receives entries that cannot be unmarshalled.
	defaultDeadLetterTopic = "spillway.deadletter"
	// defaultWindow is how many entries a consumer hands over before the
	// oldest is settled: one, upstream's behaviour.
	defaultWindow = 1
	// maxWindow bounds Window: every entry of a window is held pending
	// and kept alive.
	maxWindow = 1024
)

// tlsEnabled reports whether t turns TLS on: Enabled, or a CA or client
// certificate file set.
func tlsEnabled(t spillway.TLSConfig) bool { return t.Enabled || t.CAFile != "" || t.CertFile != "" }

// KeepAliveConfig configures the keep-alive of held entries (see the
// package documentation and docs/redis.md).
type KeepAliveConfig struct {
	// Interval is how often the pending entries held by the subscriber are
	// refreshed, in one batch. Default: MaxIdleTime / 3, so two refreshes
	// in a row can be missed before an entry becomes claimable. Must be
	// shorter than MaxIdleTime.
	Interval time.Duration `yaml:"interval" env:"INTERVAL"`
	// MaxInFlight is how long a consumer may hold entries without acking
	// any. A handler (or a wait for budget) that lasts longer is presumed
	// stuck: the entries its consumer holds are no longer refreshed and
	// peers claim them MaxIdleTime later. Default 5m.
	MaxInFlight time.Duration `yaml:"max_in_flight" env:"MAX_IN_FLIGHT"`
	// Disabled turns the keep-alive off: entries are claimed by peers once
	// idle for MaxIdleTime, however busy their handler is (upstream's
	// behaviour).
	Disabled bool `yaml:"disabled" env:"DISABLED"`
}

// Config configures [NewPublisher], [NewSubscriber] and [NewDeadLetter].
// The zero value plus Addr and ConsumerGroup is a working configuration;
// every other field has a default, stated on the field (docs/redis.md
// explains them).
//
// The yaml and env tags are the keys of the router's redis section
// (redis.max_idle_time, SPILLWAY_REDIS_MAX_IDLE_TIME); there ConsumerGroup
// is the prefix of each handler's group (see the router package).
//
// Config holds its password (and TLS.KeyPEM) as a [spillway.Secret]: it
// is never logged, and printing a Config with %v, %+v or %#v redacts it.
type Config struct {
	// Addr is the server's host:port, or [spillway.Embedded] ("embedded")
	// for an in-process miniredis, once package
	// github.com/spillway-go/spillway/embedded is imported (without it,
	// this address is a validation error). It is meant for demos:
	// miniredis does not implement idle times, delivery counts or
	// consumer-group lag the way Redis does, so claims, keep-alive and lag
	// are only approximate there.
	Addr string `yaml:"addr" env:"ADDR"`
	// Username and Password authenticate (AUTH / HELLO). Username may be
	// empty for the default user. Password is a Secret: convert a string
	// with spillway.Secret(s).
	Username string `yaml:"username" env:"USERNAME"`
	// Password is the AUTH password, never printed.
	Password spillway.Secret `yaml:"password" env:"PASSWORD"`
	// DB is the database number (SELECT). Default 0.
	DB int `yaml:"db" env:"DB"`
	// TLS configures transport security. It is on when TLS.Enabled is
	// true or when CAFile or CertFile is set; a client certificate needs
	// its key (KeyFile or KeyPEM, not both). ServerName defaults to the
	// host part of Addr.
	TLS spillway.TLSConfig `yaml:"tls" envPrefix:"TLS_"`

	// ConsumerGroup is the Redis consumer group the subscriber joins; every
	// process of one service uses the same group, so each entry is handled
	// by one of them. Required by Validate and NewSubscriber; NewPublisher
	// ignores it.
	ConsumerGroup string `yaml:"consumer_group" env:"CONSUMER_GROUP"`
	// Consumer is the base consumer name. It must be unique among the live
	// processes of the group: two subscribers sharing a name would refresh,
	// claim back and acknowledge each other's entries. Default
	// "<hostname>-<program>-<pid>-<random>", reduced to letters, digits,
	// '.', '_' and '-', unique to each process (and each [Subscriber] of a
	// process gets its own "-<n>" after it). Set a name that is stable
	// across restarts (a pod name, an instance ordinal) to have a
	// restarted process take back at once the entries its previous
	// incarnation left pending (see Subscriber); with the default they are
	// claimed by the group after MaxIdleTime. With Consumers > 1 the
	// consumers are named "<Consumer>-0" … "<Consumer>-<Consumers-1>".
	Consumer string `yaml:"consumer" env:"CONSUMER"`
	// Consumers is the number of consumers (subscriptions) per topic in
	// this process; together they are the budget's concurrency. Default 4:
	// one subscription delivers one message at a time (see Window).
	Consumers int `yaml:"consumers" env:"CONSUMERS"`
	// Window is how many messages each consumer may hand over before the
	// first of them is acked or nacked. Default 1: a consumer hands over
	// one message and waits for it, so at most Consumers messages per
	// topic are out. With more, a consumer keeps handing over entries
	// while earlier ones wait for budget, which lets light messages reach
	// a budget lane of their own when they share a stream with heavy ones
	// (lanes by charge). Entries of a consumer group carry no order, so
	// nothing is given up; every entry handed over stays pending, kept
	// alive and revocable until its ack, and each one that has been out
	// for KeepAlive.MaxInFlight is let go on its own. At most 1024.
	Window int `yaml:"window" env:"WINDOW"`

	// BlockTime is how long one read blocks waiting for entries. Default
	// 500ms; it bounds the idle polling rate, not the latency. The first
	// read blocks this long too (upstream's DisableIndefiniteInitialBlock
	// is always set). With the keep-alive on it must be shorter than half
	// of MaxIdleTime − KeepAlive.Interval: an entry a read waited for
	// counts as delivered when the read was sent.
	BlockTime time.Duration `yaml:"block_time" env:"BLOCK_TIME"`
	// ClaimInterval is how often idle entries are looked for. Default 5s:
	// a dead consumer's work is taken over within MaxIdleTime + ClaimInterval.
	ClaimInterval time.Duration `yaml:"claim_interval" env:"CLAIM_INTERVAL"`
	// MaxIdleTime is the redelivery deadline: a pending entry idle for this
	// long (not refreshed by the keep-alive) is claimed by another
	// consumer and run again. Default 30s. Size the vertex budget against
	// it (admitted work should drain well within it): it is the deadline
	// whenever the keep-alive is disabled, cannot reach Redis, or has given
	// up on a message after KeepAlive.MaxInFlight.
	MaxIdleTime time.Duration `yaml:"max_idle_time" env:"MAX_IDLE_TIME"`
	// NackResendSleep is the pause before a nacked message is redelivered.
	// Default 100ms; negative means no pause.
	NackResendSleep time.Duration `yaml:"nack_resend_sleep" env:"NACK_RESEND_SLEEP"`
	// KeepAlive configures the keep-alive of held entries.
	KeepAlive KeepAliveConfig `yaml:"keep_alive" envPrefix:"KEEP_ALIVE_"`
	// MaxDeliveries is how many times an entry may be delivered to the
	// group: a first read, every claim from a consumer that died, stalled
	// or let it go (Redis's delivery count, less the deliveries a stuck
	// consumer never handed to a handler), and every time a subscriber
	// hands a nacked message over again (see [Deliveries]). A delivery past
	// it is flagged for the [DeadLetter] middleware, which moves it to
	// DeadLetterTopic instead of running its handler: a payload that
	// kills its consumer process kills at most MaxDeliveries of them, and
	// a handler that keeps failing an entry runs it MaxDeliveries times.
	// Default 5; negative means unlimited.
	MaxDeliveries int `yaml:"max_deliveries" env:"MAX_DELIVERIES"`

	// DefaultMaxLen bounds every stream the publisher writes to about this
	// many entries (XADD MAXLEN ~): when it overflows, Redis trims the
	// oldest entries, read or not. 0 means unbounded. MaxLen overrides it
	// per topic (a value of 0 there makes that topic unbounded).
	DefaultMaxLen int64 `yaml:"default_max_len" env:"DEFAULT_MAX_LEN"`
	// MaxLen bounds the named topics' streams, overriding DefaultMaxLen.
	MaxLen map[string]int64 `yaml:"max_len" env:"MAX_LEN"`

	// DeadLetterTopic is the stream malformed entries, and entries
	// delivered more than MaxDeliveries times, are moved to by the
	// [DeadLetter] middleware. Default spillway.deadletter.
	DeadLetterTopic string `yaml:"dead_letter_topic" env:"DEAD_LETTER_TOPIC"`
}

func (c *Config) setDefaults() {
	if c.Consumer == "" {
		c.Consumer = defaultConsumerName()
	}
	if c.Consumers == 0 {
		c.Consumers = defaultConsumers
	}
	if c.Window == 0 {
		c.Window = defaultWindow
	}
	if c.BlockTime == 0 {
		c.BlockTime = defaultBlockTime
	}
	if c.ClaimInterval == 0 {
		c.ClaimInterval = defaultClaimInterval
	}
	if c.MaxIdleTime == 0 {
		c.MaxIdleTime = defaultMaxIdleTime
	}
	if c.NackResendSleep == 0 {
		c.NackResendSleep = defaultNackResendSleep
	}
	if c.KeepAlive.Interval == 0 && c.MaxIdleTime > 0 {
		// Derived from MaxIdleTime only when that is usable: a bad
		// MaxIdleTime is reported on its own, not again here.
		c.KeepAlive.Interval = c.MaxIdleTime / 3
	}
	if c.KeepAlive.MaxInFlight == 0 {
		c.KeepAlive.MaxInFlight = defaultMaxInFlight
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = defaultMaxDeliveries
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = defaultDeadLetterTopic
	}
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

// invalid is the [*spillway.FieldError] for field (its Go name in
// [Config]) and value.
func invalid(field string, value any, why string) error {
	return &spillway.FieldError{Field: field, Value: fmt.Sprint(value), Reason: why}
}

// Validate reports the first problem with the configuration, as used by a
// subscriber (the publisher needs a subset of it), as a
// [*spillway.FieldError] naming the field by its Go name (a password is
// never part of it). Unset fields are checked as their defaults would be.
func (c Config) Validate() error {
	if err := c.validateConnection(); err != nil {
		return err
	}
	return c.validateSubscriber()
}

// validateConnection checks what a publisher needs: how to dial and how
// to write streams.
func (c Config) validateConnection() error {
	if err := c.validateDial(); err != nil {
		return err
	}
	return c.validateStreams()
}

// validateDial checks the connection fields, which a client given with
// [WithClient] makes irrelevant.
func (c Config) validateDial() error {
	c.setDefaults()
	if c.Addr == "" {
		return invalid("Addr", "", "required (host:port or \"embedded\")")
	}
	if c.Addr != spillway.Embedded {
		host, port, err := net.SplitHostPort(c.Addr)
		if err != nil || host == "" {
			return invalid("Addr", c.Addr, "want host:port or \"embedded\"")
		}
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			return invalid("Addr", c.Addr, "bad port")
		}
	}
	if c.DB < 0 {
		return invalid("DB", c.DB, "must be >= 0")
	}
	if c.TLS.KeyFile != "" && c.TLS.KeyPEM != "" {
		return invalid("TLS.KeyPEM", c.TLS.KeyPEM, "set either KeyFile or KeyPEM, not both")
	}
	if hasKey := c.TLS.KeyFile != "" || c.TLS.KeyPEM != ""; (c.TLS.CertFile == "") == hasKey {
		return invalid("TLS.CertFile/KeyFile", c.TLS.CertFile+"/"+c.TLS.KeyFile, "set both or neither")
	}
	if tlsEnabled(c.TLS) && c.Addr == spillway.Embedded {
		return invalid("TLS", "enabled", "not supported with the embedded server")
	}
	if c.Addr == spillway.Embedded && !embeddedLinked() {
		return fmt.Errorf("%w: %w", invalid("Addr", c.Addr, "needs the embedded server linked in"), spillway.ErrEmbeddedNotLinked)
	}
	return nil
}

// validateStreams checks the stream fields (trimming, dead letters).
func (c Config) validateStreams() error {
	c.setDefaults()
	if c.DefaultMaxLen < 0 {
		return invalid("DefaultMaxLen", c.DefaultMaxLen, "must be >= 0 (0: unbounded)")
	}
	topics := make([]string, 0, len(c.MaxLen))
	for topic := range c.MaxLen {
		topics = append(topics, topic)
	}
	sort.Strings(topics)
	for _, topic := range topics {
		if n := c.MaxLen[topic]; n < 0 {
			return invalid("MaxLen["+strconv.Quote(topic)+"]", n, "must be >= 0 (0: unbounded)")
		}
	}
	if c.DeadLetterTopic == "" {
		return invalid("DeadLetterTopic", "", "must not be empty")
	}
	return nil
}

func (c Config) validateSubscriber() error {
	c.setDefaults()
	switch {
	case c.ConsumerGroup == "":
		return invalid("ConsumerGroup", "", "required by a subscriber")
	case c.Consumers < 1:
		return invalid("Consumers", c.Consumers, "must be >= 1")
	case c.Consumers > 1024:
		return invalid("Consumers", c.Consumers, "must be <= 1024")
	case c.Window < 1 || c.Window > maxWindow:
		return invalid("Window", c.Window, "must be between 1 and "+strconv.Itoa(maxWindow)+" (messages each consumer hands over at once)")
	case c.BlockTime < time.Millisecond:
		return invalid("BlockTime", c.BlockTime, "must be >= 1ms")
	case c.ClaimInterval < time.Millisecond:
		return invalid("ClaimInterval", c.ClaimInterval, "must be >= 1ms")
	case c.MaxIdleTime < time.Millisecond:
		return invalid("MaxIdleTime", c.MaxIdleTime, "must be >= 1ms")
	case !c.KeepAlive.Disabled && c.KeepAlive.Interval <= 0:
		return invalid("KeepAlive.Interval", c.KeepAlive.Interval, "must be > 0")
	case !c.KeepAlive.Disabled && c.KeepAlive.Interval >= c.MaxIdleTime:
		return invalid("KeepAlive.Interval", c.KeepAlive.Interval, "must be shorter than MaxIdleTime ("+c.MaxIdleTime.String()+")")
	case !c.KeepAlive.Disabled && c.BlockTime >= (c.MaxIdleTime-c.KeepAlive.Interval)/2:
		// An entry a read waited for counts from when the read was sent,
		// and must not lapse before its first refresh.
		return invalid("BlockTime", c.BlockTime, "must be shorter than half of MaxIdleTime − KeepAlive.Interval ("+
			((c.MaxIdleTime-c.KeepAlive.Interval)/2).String()+"): shorten it, or lengthen MaxIdleTime")
	case !c.KeepAlive.Disabled && c.KeepAlive.MaxInFlight <= 0:
		return invalid("KeepAlive.MaxInFlight", c.KeepAlive.MaxInFlight, "must be > 0")
	case strings.ContainsAny(c.Consumer, " \t\r\n"):
		return invalid("Consumer", c.Consumer, "must not contain white space")
	}
	return nil
}

// consumerNames returns the consumer names a subscriber with this
// configuration uses, after defaults: Consumer itself when Consumers is 1,
// otherwise Consumer-0 … Consumer-(Consumers-1).
func (c Config) consumerNames() []string {
	c.setDefaults()
	if c.Consumers <= 1 {
		return []string{c.Consumer}
	}
	names := make([]string, c.Consumers)
	for i := range names {
		names[i] = c.Consumer + "-" + strconv.Itoa(i)
	}
	return names
}

// defaultConsumerName returns "<hostname>-<program>-<pid>-<random>",
// reduced to letters, digits, '.', '_' and '-': the same for the whole
// life of a process, different in every process, even two of one program
// on one host, or two containers with the same host name and PID. Host,
// program and PID are there to find the process behind a consumer in
// XINFO CONSUMERS; the random part makes it unique.
func defaultConsumerName() string {
	processNameOnce.Do(func() {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "localhost"
		}
		prog := "spillway"
		if len(os.Args) > 0 && os.Args[0] != "" {
			prog = filepath.Base(os.Args[0])
		}
		var b [4]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		processName = sanitizeName(host) + "-" + sanitizeName(prog) + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
	})
	return processName
}

var (
	processNameOnce sync.Once
	processName     string
	// defaultNamed counts the subscribers of this process that took the
	// default consumer name, each of which gets its own suffix.
	defaultNamed atomic.Int64
)

func sanitizeName(s string) string {
	b := []byte(s)
	for i, ch := range b {
		ok := ch == '.' || ch == '_' || ch == '-' ||
			(ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
		if !ok {
			b[i] = '_'
		}
	}
	return string(b)
}

// tlsConfig builds the client TLS configuration, or nil when TLS is off.
func (c Config) tlsConfig() (*tls.Config, error) {
	if !tlsEnabled(c.TLS) {
		return nil, nil
	}
	host, _, _ := net.SplitHostPort(c.Addr)
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         host,
		InsecureSkipVerify: c.TLS.InsecureSkipVerify, //nolint:gosec // explicit opt-in, documented as test-only
	}
	if c.TLS.ServerName != "" {
		tc.ServerName = c.TLS.ServerName
	}
	if c.TLS.CAFile != "" {
		pem, err := os.ReadFile(c.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redisbroker: TLS.CAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, invalid("TLS.CAFile", c.TLS.CAFile, "holds no PEM certificate")
		}
		tc.RootCAs = pool
	}
	switch {
	case c.TLS.CertFile != "" && c.TLS.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("redisbroker: TLS.CertFile/KeyFile: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	case c.TLS.CertFile != "":
		certPEM, err := os.ReadFile(c.TLS.CertFile)
		if err != nil {
			return nil, fmt.Errorf("redisbroker: TLS.CertFile: %w", err)
		}
		cert, err := tls.X509KeyPair(certPEM, []byte(c.TLS.KeyPEM))
		if err != nil {
			// Never quote the key: this error may be logged.
			return nil, invalid("TLS.KeyPEM", c.TLS.KeyPEM, "is not a valid key for TLS.CertFile")
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
