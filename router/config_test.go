package router

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/embedreg"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/shedding"
	"github.com/spillway-go/spillway/sizing"
)

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "spillway.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// clearEnv unsets every SPILLWAY_ variable for the test.
func clearEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, envVarPrefix) {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

func TestDefaults(t *testing.T) {
	clearEnv(t)
	c, err := LoadConfig("")
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Broker: brokerMemory, ConsumerGroup: "spillway", CloseTimeout: 30 * time.Second}
	want.Budget.Vertices = 200_000
	want.Budget.MaxPayloadBytes = 16 << 20
	want.Budget.AutoSize = AutoSizeConfig{Processes: 1, Config: sizing.Config{Headroom: 0.5, Floor: 1, Windows: 5, MinWindows: 3, Hysteresis: 0.1, TailShare: 0.75}}
	want.Shedding.Config = shedding.Config{EntityKey: "entity_id", VersionKey: "entity_version"}
	want.Shedding.Priority = shedding.PriorityConfig{Window: 30 * time.Second, Key: "region_priority", ShedBelow: 2}
	want.Shedding.VersionGuard.MaxEntities = 100_000
	want.Shedding.Pressure = pressureBudget
	want.Retry.Config = retrygate.Config{
		MaxAttempts: 5, InitialInterval: 100 * time.Millisecond, MaxInterval: 5 * time.Second, Multiplier: 2, Jitter: 0.5,
		MaxElapsedTime: 10 * time.Second, RetryRate: 10, RetryBurst: 10, RetryRatio: 0.2, Defer: retrygate.DeferRepublish,
		RetryTopic: "{topic}.retry", DeadLetterTopic: "{topic}.dead_letter",
	}
	want.Kafka = kafkabroker.Config{
		ConsumerGroup: "spillway", Partitions: 12, ReplicationFactor: 1,
		KeyMetadata: "entity_id", Version: "3.6.0", ClientID: "spillway", ChannelBufferSize: 16,
		FetchDefaultBytes: 256 << 10, RebalanceTimeout: 60 * time.Second, SessionTimeout: 10 * time.Second,
		HeartbeatInterval: time.Second, InitialOffset: "oldest", NackResendSleep: 100 * time.Millisecond,
		Consumer: "partition", WindowMessages: 128, WindowBytes: 4 << 20,
		Partitioner: "murmur2", IsolationLevel: "read_committed",
	}
	want.Redis = redisbroker.Config{
		ConsumerGroup: "spillway", Consumers: 4, BlockTime: 500 * time.Millisecond, ClaimInterval: 5 * time.Second,
		MaxIdleTime: 30 * time.Second, NackResendSleep: 100 * time.Millisecond, Window: 1,
		KeepAlive:       redisbroker.KeepAliveConfig{Interval: 10 * time.Second, MaxInFlight: 5 * time.Minute},
		MaxDeliveries:   5,
		DeadLetterTopic: "spillway.deadletter",
	}
	want.Telemetry = TelemetryConfig{Name: "spillway", LagInterval: 10 * time.Second}
	want.Producer.RateLimit.Mode = "block"
	want.Producer.LagThrottle.Step, want.Producer.LagThrottle.Max = 100*time.Millisecond, 5*time.Second
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n%v\nwant\n%v", c, want)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config does not validate: %v", err)
	}
	kc := Config{Broker: brokerKafka}
	if err := kc.Validate(); err == nil || !strings.Contains(err.Error(), "kafka.brokers") {
		t.Errorf("kafka Config without brokers: %v, want a kafka.brokers error", err)
	}
	kc.Kafka.Brokers = []string{"kafka-1:9092"}
	if err := kc.Validate(); err != nil {
		t.Errorf("kafka Config with only brokers does not validate: %v", err)
	}
	if d := kc.RedeliveryDeadline(); d != 60*time.Second {
		t.Errorf("RedeliveryDeadline = %s", d)
	}
}

// TestValidateNamesFieldAndValue: every field's bad value gives an error
// naming the field and the value.
func TestValidateNamesFieldAndValue(t *testing.T) {
	kafka := func(f func(*kafkabroker.Config)) Config {
		c := Config{Broker: brokerKafka}
		c.Kafka.Brokers = []string{"broker-1:9092"}
		f(&c.Kafka)
		return c
	}
	cases := []struct {
		name  string
		cfg   Config
		field string
		value string
	}{
		{"broker", Config{Broker: "rabbitmq"}, "broker", "rabbitmq"},
		{"close timeout", Config{CloseTimeout: -time.Second}, "close_timeout", "-1s"},
		{"budget vertices", Config{Budget: BudgetConfig{Vertices: -5}}, "budget.vertices", "-5"},
		{"message limit", Config{Budget: BudgetConfig{MessageLimit: -1}}, "budget.message_limit", "-1"},
		{"default cost", Config{Budget: BudgetConfig{DefaultCost: -2}}, "budget.default_cost", "-2"},
		{"brokers", kafka(func(k *kafkabroker.Config) { k.Brokers = []string{"no-port"} }), "kafka.brokers[0]", "no-port"},
		{"embedded mixed", kafka(func(k *kafkabroker.Config) { k.Brokers = []string{"a:1", "embedded"} }), "kafka.brokers[1]", "embedded"},
		{"group", kafka(func(k *kafkabroker.Config) { k.ConsumerGroup = "  " }), "kafka.consumer_group", "  "},
		{"topics", kafka(func(k *kafkabroker.Config) { k.Topics = []string{"ok", ""} }), "kafka.topics[1]", ""},
		{"partitions", kafka(func(k *kafkabroker.Config) { k.Partitions = -3 }), "kafka.partitions", "-3"},
		{"replication", kafka(func(k *kafkabroker.Config) { k.ReplicationFactor = -1 }), "kafka.replication_factor", "-1"},
		{"version", kafka(func(k *kafkabroker.Config) { k.Version = "latest" }), "kafka.version", "latest"},
		{"old version", kafka(func(k *kafkabroker.Config) { k.Version = "0.10.0" }), "kafka.version", "0.10.0"},
		{"embedded version", Config{Broker: brokerKafka, Kafka: kafkabroker.Config{Brokers: []string{"embedded"}, Version: "3.6.0"}}, "kafka.version", "3.6.0"},
		{"no brokers", Config{Broker: brokerKafka}, "kafka.brokers", ""},
		{"buffer", kafka(func(k *kafkabroker.Config) { k.ChannelBufferSize = -1 }), "kafka.channel_buffer_size", "-1"},
		{"consumer", kafka(func(k *kafkabroker.Config) { k.Consumer = "unordered" }), "kafka.consumer", "unordered"},
		{"window messages", kafka(func(k *kafkabroker.Config) { k.WindowMessages = -1 }), "kafka.window_messages", "-1"},
		{"window bytes", kafka(func(k *kafkabroker.Config) { k.WindowBytes = -1 }), "kafka.window_bytes", "-1"},
		{"fetch", kafka(func(k *kafkabroker.Config) { k.FetchDefaultBytes = -1 }), "kafka.fetch_default_bytes", "-1"},
		{"rebalance", kafka(func(k *kafkabroker.Config) { k.RebalanceTimeout = -time.Second }), "kafka.rebalance_timeout", "-1s"},
		{"rebalance precision", kafka(func(k *kafkabroker.Config) { k.RebalanceTimeout = 1500 * time.Microsecond }), "kafka.rebalance_timeout", "1.5ms"},
		{"session", kafka(func(k *kafkabroker.Config) { k.SessionTimeout = -time.Second }), "kafka.session_timeout", "-1s"},
		{"heartbeat", kafka(func(k *kafkabroker.Config) { k.HeartbeatInterval = -time.Second }), "kafka.heartbeat_interval", "-1s"},
		{"heartbeat vs session", kafka(func(k *kafkabroker.Config) { k.HeartbeatInterval = 20 * time.Second }), "kafka.heartbeat_interval", "20s"},
		{"initial offset", kafka(func(k *kafkabroker.Config) { k.InitialOffset = "earliest" }), "kafka.initial_offset", "earliest"},
		{"nack sleep", kafka(func(k *kafkabroker.Config) { k.NackResendSleep = -time.Second }), "kafka.nack_resend_sleep", "-1s"},
		{"tls cert without key", kafka(func(k *kafkabroker.Config) { k.TLS = spillway.TLSConfig{Enabled: true, CertFile: "c.pem"} }), "kafka.tls.cert_file", "c.pem"},
		{"tls key without cert", kafka(func(k *kafkabroker.Config) { k.TLS = spillway.TLSConfig{Enabled: true, KeyFile: "k.pem"} }), "kafka.tls.key_file", "k.pem"},
		{"tls two keys", kafka(func(k *kafkabroker.Config) {
			k.TLS = spillway.TLSConfig{Enabled: true, CertFile: "c.pem", KeyFile: "k.pem", KeyPEM: "-----BEGIN PRIVATE KEY-----"}
		}), "kafka.tls.key_pem", "[redacted]"},
		{"tls disabled", kafka(func(k *kafkabroker.Config) { k.TLS = spillway.TLSConfig{CAFile: "ca.pem"} }), "kafka.tls.enabled", "false"},
		{"sasl mechanism", kafka(func(k *kafkabroker.Config) {
			k.SASL = kafkabroker.SASLConfig{Mechanism: "GSSAPI", User: "u", Password: "p"}
		}), "kafka.sasl.mechanism", "GSSAPI"},
		{"sasl user", kafka(func(k *kafkabroker.Config) { k.SASL = kafkabroker.SASLConfig{Mechanism: "PLAIN", Password: "hunter2"} }), "kafka.sasl.user", ""},
		{"sasl password", kafka(func(k *kafkabroker.Config) { k.SASL = kafkabroker.SASLConfig{Mechanism: "SCRAM-SHA-512", User: "u"} }), "kafka.sasl.password", ""},
		{"sasl without mechanism", kafka(func(k *kafkabroker.Config) { k.SASL = kafkabroker.SASLConfig{User: "u", Password: "hunter2"} }), "kafka.sasl.mechanism", ""},

		{"shedding window", withShedding(func(c *shedding.Config) { c.Priority.Window = -time.Second }), "shedding.priority.window", "-1s"},
		{"shedding duplicate topic", withShedding(func(c *shedding.Config) { c.Topics = []string{"p", "p"} }), "shedding.topics[1]", "p"},
		{"shedding audit topic on the list", withShedding(func(c *shedding.Config) { c.AuditTopic = "p" }), "shedding.audit_topic", "p"},
		{"shedding guard without topics", Config{Shedding: SheddingConfig{Config: shedding.Config{VersionGuard: shedding.VersionGuardConfig{Enabled: true}}}},
			"shedding.version_guard.enabled", "true"},
		{"shedding coalescing on kafka", func() Config {
			c := kafka(func(*kafkabroker.Config) {})
			c.Shedding.Config = shedding.Config{Topics: []string{"p"}, Coalesce: shedding.CoalesceConfig{Enabled: true}}
			return c
		}(), "shedding.coalesce.enabled", "true"},
		{"shedding pressure unknown", func() Config {
			c := withShedding(func(*shedding.Config) {})
			c.Shedding.Pressure = "heat"
			return c
		}(), "shedding.pressure", "heat"},
		{"shedding on lag without a threshold", func() Config {
			c := withShedding(func(*shedding.Config) {})
			c.Shedding.Pressure = pressureLag
			return c
		}(), "shedding.pressure", "lag"},
		{"shedding on lag without telemetry", func() Config {
			c := withShedding(func(*shedding.Config) {})
			c.Shedding.Pressure = pressureEither
			c.Telemetry.Disabled, c.Telemetry.LagThreshold = true, 1000
			return c
		}(), "shedding.pressure", "either"},

		{"retry max attempts", withRetry(func(c *RetryConfig) { c.MaxAttempts = -1 }), "retry.max_attempts", "-1"},
		{"retry max attempts while off", Config{Retry: RetryConfig{Disabled: true, Config: retrygate.Config{MaxAttempts: -2}}}, "retry.max_attempts", "-2"},
		{"retry multiplier", withRetry(func(c *RetryConfig) { c.Multiplier = 0.5 }), "retry.multiplier", "0.5"},
		{"retry rate", withRetry(func(c *RetryConfig) { c.RetryRate = math.NaN() }), "retry.retry_rate", "NaN"},
		{"retry defer", withRetry(func(c *RetryConfig) { c.Defer = "later" }), "retry.defer", "later"},
		{"retry topics", withRetry(func(c *RetryConfig) { c.DeadLetterTopic = "{topic}.retry" }), "retry.dead_letter_topic", "{topic}.retry"},
		{"retry nack on memory", withRetry(func(c *RetryConfig) { c.Defer = retrygate.DeferNack }), "retry.defer", "nack"},
		{"retry saturated after shedding window", func() Config {
			c := withRetry(func(c *RetryConfig) { c.SaturatedAfter = 5 * time.Second })
			c.Shedding.Config = shedding.Config{Topics: []string{"p"}, Priority: shedding.PriorityConfig{Window: 5 * time.Second}}
			return c
		}(), "retry.saturated_after", "5s"},
		{"retry republished with key order", func() Config {
			c := kafka(func(k *kafkabroker.Config) { k.Consumer = kafkabroker.ConsumerKey })
			c.Retry.Defer = retrygate.DeferRepublish
			return c
		}(), "retry.defer", "republish"},
		{"retry beyond the rebalance timeout", func() Config {
			c := kafka(func(k *kafkabroker.Config) { k.RebalanceTimeout = 15 * time.Second })
			c.Retry.MaxElapsedTime, c.Retry.MaxInterval = 10*time.Second, 5*time.Second // 10s in process + 10s early-retry hold
			return c
		}(), "retry.max_elapsed_time", "10s"},

		{"autosize floor above ceiling", withAutoSize(func(a *AutoSizeConfig) { a.Floor, a.Ceiling = 500, 100 }), "budget.autosize.floor", "500"},
		{"autosize floor above memory bound", withAutoSize(func(a *AutoSizeConfig) { a.Floor, a.Ceiling, a.MemoryBound = 500, 0, 100 }),
			"budget.autosize.floor", "500"},
		{"autosize without deadline on memory", withAutoSize(func(a *AutoSizeConfig) { a.Deadline = 0 }), "budget.autosize.deadline", "0s"},
		{"autosize negative deadline", withAutoSize(func(a *AutoSizeConfig) { a.Deadline = -time.Second }), "budget.autosize.deadline", "-1s"},
		{"autosize unbounded", withAutoSize(func(a *AutoSizeConfig) { a.Ceiling = 0 }), "budget.autosize.ceiling", "0"},
		{"autosize headroom", withAutoSize(func(a *AutoSizeConfig) { a.Headroom = 1.5 }), "budget.autosize.headroom", "1.5"},
		{"autosize hysteresis", withAutoSize(func(a *AutoSizeConfig) { a.Hysteresis = 1 }), "budget.autosize.hysteresis", "1"},
		{"autosize tail share", withAutoSize(func(a *AutoSizeConfig) { a.TailShare = 1.5 }), "budget.autosize.tail_share", "1.5"},
		{"autosize parallelism", withAutoSize(func(a *AutoSizeConfig) { a.Parallelism = -1 }), "budget.autosize.parallelism", "-1"},
		{"autosize negative tail share", withAutoSize(func(a *AutoSizeConfig) { a.TailShare = -0.5 }), "budget.autosize.tail_share", "-0.5"},
		{"autosize windows", withAutoSize(func(a *AutoSizeConfig) { a.Windows, a.MinWindows = 2, 4 }), "budget.autosize.min_windows", "4"},
		{"autosize window", withAutoSize(func(a *AutoSizeConfig) { a.Window = -time.Second }), "budget.autosize.window", "-1s"},
		{"autosize memory bytes without bytes per vertex", withAutoSize(func(a *AutoSizeConfig) { a.MemoryBytes = 1 << 30 }),
			"budget.autosize.bytes_per_vertex", "0"},
		{"autosize two memory bounds", withAutoSize(func(a *AutoSizeConfig) { a.MemoryBytes, a.MemoryBound, a.BytesPerVertex = 1<<30, 1000, 64 }),
			"budget.autosize.memory_bytes", "1073741824"},
		{"autosize prefetch eats the memory", withAutoSize(func(a *AutoSizeConfig) { a.MemoryBytes, a.PrefetchBytes, a.BytesPerVertex = 1000, 2000, 64 }),
			"budget.autosize.memory_bytes", "1000"},
		{"autosize bytes per vertex", withAutoSize(func(a *AutoSizeConfig) { a.BytesPerVertex = math.Inf(1) }), "budget.autosize.bytes_per_vertex", "+Inf"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil {
				t.Fatal("no error")
			}
			var ce *spillway.FieldError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *spillway.FieldError", err)
			}
			if ce.Field != tc.field || ce.Value != tc.value {
				t.Errorf("got field %q value %q, want %q %q (%v)", ce.Field, ce.Value, tc.field, tc.value, err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "config: "+tc.field+": ") || !strings.Contains(msg, fmt.Sprintf("got %q", tc.value)) {
				t.Errorf("message %q does not name field and value", msg)
			}
			if strings.Contains(msg, "hunter2") || strings.Contains(msg, "BEGIN PRIVATE KEY") {
				t.Errorf("secret in error: %q", msg)
			}
		})
	}
}

func withShedding(f func(*shedding.Config)) Config {
	c := Config{Shedding: SheddingConfig{Config: shedding.Config{Topics: []string{"p"}}}}
	f(&c.Shedding.Config)
	return c
}

func withRetry(f func(*RetryConfig)) Config {
	c := Config{}
	f(&c.Retry)
	return c
}

func withAutoSize(f func(*AutoSizeConfig)) Config {
	c := Config{}
	c.Budget.AutoSize = AutoSizeConfig{Enabled: true, Config: sizing.Config{Deadline: 10 * time.Second, Ceiling: 1_000_000}}
	f(&c.Budget.AutoSize)
	return c
}

// TestValidSections: the new sections' good values validate, and the
// auto-sizer's deadline defaults to the broker's.
func TestValidSections(t *testing.T) {
	c := Config{Broker: brokerKafka}
	c.Kafka.Brokers = []string{"kafka-1:9092"}
	c.Shedding.Config = shedding.Config{Topics: []string{"positions"}, AuditTopic: "shed", VersionGuard: shedding.VersionGuardConfig{Enabled: true}}
	c.Retry = RetryConfig{Config: retrygate.Config{RetryRate: math.Inf(1), Jitter: spillway.Off, SaturatedAfter: time.Second}}
	c.Budget.AutoSize = AutoSizeConfig{Enabled: true, MemoryBytes: 1 << 30, Processes: 2, PrefetchBytes: 1 << 20, BytesPerVertex: 100, Config: sizing.Config{Hysteresis: spillway.Off}}
	c.Shedding.Pressure, c.Telemetry.LagThreshold = pressureEither, 5000
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if d := c.autoSizeDeadline(); d != 60*time.Second { // kafka.rebalance_timeout's default
		t.Errorf("autosize deadline = %s, want the rebalance timeout", d)
	}
	if b := c.Budget.AutoSize.memoryBound(); b != ((1<<30)/2-(1<<20))/100 {
		t.Errorf("memory bound = %d", b)
	}
}

func TestLoadConfigFileAndEnv(t *testing.T) {
	clearEnv(t)
	path := writeConfig(t, `
broker: kafka
close_timeout: 5s
budget:
  vertices: 50000
kafka:
  brokers: [k1:9092, k2:9092]
  rebalance_timeout: 20s
  partitions: 6
  sasl:
    mechanism: PLAIN
    user: spillway
    password: from-file
`)
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Broker != brokerKafka || c.Budget.Vertices != 50000 || c.Kafka.RebalanceTimeout != 20*time.Second ||
		c.Kafka.Partitions != 6 || !reflect.DeepEqual(c.Kafka.Brokers, []string{"k1:9092", "k2:9092"}) {
		t.Errorf("file not applied: %v", c)
	}
	if c.Kafka.SessionTimeout != 10*time.Second {
		t.Errorf("defaults not applied under the file: %s", c.Kafka.SessionTimeout)
	}

	// The environment wins over the file.
	t.Setenv("SPILLWAY_BUDGET_VERTICES", "75000")
	t.Setenv("SPILLWAY_KAFKA_BROKERS", "k3:9092,k4:9093")
	t.Setenv("SPILLWAY_KAFKA_REBALANCE_TIMEOUT", "45s")
	t.Setenv("SPILLWAY_KAFKA_SASL_PASSWORD", "from-env")
	t.Setenv("SPILLWAY_KAFKA_TLS_ENABLED", "true")
	c, err = LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Budget.Vertices != 75000 || c.Kafka.RebalanceTimeout != 45*time.Second ||
		!reflect.DeepEqual(c.Kafka.Brokers, []string{"k3:9092", "k4:9093"}) ||
		c.Kafka.SASL.Password != "from-env" || !c.Kafka.TLS.Enabled {
		t.Errorf("environment did not override the file: %#v", c.Kafka)
	}
	if c.Kafka.Partitions != 6 || c.CloseTimeout != 5*time.Second {
		t.Errorf("file values lost: %v", c)
	}

	t.Setenv("SPILLWAY_BROKER", "memory")
	if c, err = LoadConfig(path); err != nil || c.Broker != brokerMemory {
		t.Errorf("SPILLWAY_BROKER: %v, %v", c.Broker, err)
	}
}

// TestLoadConfigSections: the shedding, retry and autosize sections from
// YAML, then the environment on top.
func TestLoadConfigSections(t *testing.T) {
	clearEnv(t)
	path := writeConfig(t, `
shedding:
  topics: [vehicle.positions, sensor.telemetry]
  audit_topic: spillway.shed
  priority:
    window: 10s
    shed_below: 3
  version_guard:
    enabled: true
retry:
  max_attempts: 3
  retry_rate: .inf
  jitter: -1
  saturated_after: 2s
  retry_topic: retries.{topic}
budget:
  vertices: 40000
  autosize:
    enabled: true
    deadline: 20s
    floor: 1000
    ceiling: 500000
    window: 5s
    hysteresis: 0.25
`)
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Shedding.Topics, []string{"vehicle.positions", "sensor.telemetry"}) || c.Shedding.AuditTopic != "spillway.shed" ||
		c.Shedding.Priority.Window != 10*time.Second || c.Shedding.Priority.ShedBelow != 3 || !c.Shedding.VersionGuard.Enabled {
		t.Errorf("shedding not applied: %+v", c.Shedding)
	}
	if c.Shedding.Priority.Key != "region_priority" {
		t.Errorf("shedding defaults not applied: %+v", c.Shedding.Priority)
	}
	if c.Retry.Disabled || c.Retry.MaxAttempts != 3 || !math.IsInf(c.Retry.RetryRate, 1) || c.Retry.Jitter != spillway.Off ||
		c.Retry.SaturatedAfter != 2*time.Second || c.Retry.RetryTopicFor("x") != "retries.x" {
		t.Errorf("retry not applied: %+v", c.Retry)
	}
	if c.Retry.MaxInterval != 5*time.Second || c.Retry.DeadLetterTopicFor("x") != "x.dead_letter" {
		t.Errorf("retry defaults not applied: %+v", c.Retry)
	}
	a := c.Budget.AutoSize
	if !a.Enabled || a.Deadline != 20*time.Second || a.Floor != 1000 || a.Ceiling != 500_000 || a.Window != 5*time.Second ||
		a.Hysteresis != 0.25 || a.Windows != defaultAutoSizeWindows {
		t.Errorf("autosize not applied: %+v", a)
	}
	if !strings.Contains(c.String(), "retry_rate: .inf") || !strings.Contains(c.String(), "max_attempts: 3") {
		t.Errorf("String() does not render the retry section inline:\n%s", c)
	}

	t.Setenv("SPILLWAY_SHEDDING_TOPICS", "a,b,c")
	t.Setenv("SPILLWAY_SHEDDING_PRIORITY_WINDOW", "15s")
	t.Setenv("SPILLWAY_SHEDDING_VERSION_GUARD_MAX_ENTITIES", "500")
	t.Setenv("SPILLWAY_RETRY_MAX_ATTEMPTS", "7")
	t.Setenv("SPILLWAY_RETRY_RETRY_RATE", "-1")
	t.Setenv("SPILLWAY_RETRY_MULTIPLIER", "1.5")
	t.Setenv("SPILLWAY_RETRY_DEFER", "republish")
	t.Setenv("SPILLWAY_BUDGET_AUTOSIZE_FLOOR", "2000")
	t.Setenv("SPILLWAY_BUDGET_AUTOSIZE_MEMORY_BOUND", "400000")
	t.Setenv("SPILLWAY_BUDGET_AUTOSIZE_DEADLINE", "30s")
	if c, err = LoadConfig(path); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Shedding.Topics, []string{"a", "b", "c"}) || c.Shedding.Priority.Window != 15*time.Second ||
		c.Shedding.VersionGuard.MaxEntities != 500 || c.Shedding.AuditTopic != "spillway.shed" {
		t.Errorf("environment did not override shedding: %+v", c.Shedding)
	}
	if c.Retry.MaxAttempts != 7 || c.Retry.RetryRate != spillway.Off || c.Retry.Multiplier != 1.5 || c.Retry.Disabled {
		t.Errorf("environment did not override retry: %+v", c.Retry)
	}
	if a := c.Budget.AutoSize; a.Floor != 2000 || a.MemoryBound != 400_000 || a.Deadline != 30*time.Second || a.Ceiling != 500_000 {
		t.Errorf("environment did not override autosize: %+v", a)
	}

	t.Setenv("SPILLWAY_RETRY_DISABLED", "true")
	t.Setenv("SPILLWAY_RETRY_RETRY_RATE", "Inf")
	if c, err = LoadConfig(path); err != nil || !c.Retry.Disabled || !math.IsInf(c.Retry.RetryRate, 1) {
		t.Errorf("SPILLWAY_RETRY_DISABLED=true, RETRY_RATE=Inf: disabled %v, rate %v, %v", c.Retry.Disabled, c.Retry.RetryRate, err)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		env        map[string]string
		want       []string // substrings of the error
		secret     string   // must not appear
	}{
		{name: "unknown key", yaml: "kafka:\n  rebalance_timout: 5s\n", want: []string{"kafka.rebalance_timout", ":2)", "unknown field"}},
		{name: "bad duration in file", yaml: "kafka:\n  rebalance_timeout: soon\n", want: []string{"kafka.rebalance_timeout", `"soon"`, "duration"}},
		{name: "duration as number", yaml: "close_timeout: 30\n", want: []string{"close_timeout", `"30"`}},
		{name: "bad int in file", yaml: "budget:\n  vertices: lots\n", want: []string{"budget.vertices", `"lots"`}},
		{name: "list expected", yaml: "kafka:\n  brokers: {a: b}\n", want: []string{"kafka.brokers", "<mapping>"}},
		{name: "validation after file", yaml: "broker: kafka\nkafka:\n  rebalance_timeout: -1s\n", want: []string{`config: kafka.rebalance_timeout: must be positive, got "-1s"`}},
		{name: "bad duration in env", env: map[string]string{"SPILLWAY_KAFKA_REBALANCE_TIMEOUT": "abc"},
			want: []string{"kafka.rebalance_timeout", "SPILLWAY_KAFKA_REBALANCE_TIMEOUT", `"abc"`}},
		{name: "bad int in env", env: map[string]string{"SPILLWAY_BUDGET_VERTICES": "1e9x"},
			want: []string{"budget.vertices", "SPILLWAY_BUDGET_VERTICES", `"1e9x"`}},
		{name: "bad bool in env", env: map[string]string{"SPILLWAY_KAFKA_TLS_ENABLED": "yes please"},
			want: []string{"kafka.tls.enabled", `"yes please"`}},
		{name: "bad broker in env", env: map[string]string{"SPILLWAY_BROKER": "nats"}, want: []string{"broker", `"nats"`}},
		{name: "secret in file", yaml: "kafka:\n  sasl:\n    password: [hunter2]\n", want: []string{"kafka.sasl.password"}, secret: "hunter2"},

		{name: "bad int in retry", yaml: "retry:\n  max_attempts: many\n", want: []string{"retry.max_attempts", ":2)", `"many"`, "an integer (int)"}},
		{name: "bad float in retry", yaml: "retry:\n  multiplier: fast\n", want: []string{"retry.multiplier", `"fast"`, "a number"}},
		{name: "unknown key in retry", yaml: "retry:\n  maximum_attempts: 3\n", want: []string{"retry.maximum_attempts", "unknown field"}},
		{name: "unknown key in shedding", yaml: "shedding:\n  priority:\n    windw: 5s\n", want: []string{"shedding.priority.windw", ":3)", "unknown field"}},
		{name: "bad duration in shedding", yaml: "shedding:\n  priority:\n    window: soon\n", want: []string{"shedding.priority.window", `"soon"`, "duration"}},
		{name: "shedding topics not a list", yaml: "shedding:\n  topics: {a: b}\n", want: []string{"shedding.topics", "<mapping>", "a list of strings"}},
		{name: "bad float in autosize", yaml: "budget:\n  autosize:\n    headroom: half\n", want: []string{"budget.autosize.headroom", `"half"`, "a number"}},
		{name: "shedding validation after file", yaml: "shedding:\n  topics: [p]\n  priority:\n    window: -5s\n",
			want: []string{`config: shedding.priority.window: must be positive, got "-5s"`}},
		{name: "retry validation after file", yaml: "retry:\n  disabled: false\n  defer: nack\n",
			want: []string{`config: retry.defer: must be republish on memory`, `got "nack"`}},
		{name: "autosize validation after file", yaml: "budget:\n  autosize:\n    enabled: true\n    deadline: 10s\n    floor: 9000\n    ceiling: 100\n",
			want: []string{`config: budget.autosize.floor: must not be above budget.autosize.ceiling (100), got "9000"`}},
		{name: "bad float in env", env: map[string]string{"SPILLWAY_RETRY_JITTER": "lots"},
			want: []string{"retry.jitter", "SPILLWAY_RETRY_JITTER", `"lots"`}},
		{name: "bad int in env autosize", env: map[string]string{"SPILLWAY_BUDGET_AUTOSIZE_FLOOR": "x"},
			want: []string{"budget.autosize.floor", "SPILLWAY_BUDGET_AUTOSIZE_FLOOR", `"x"`}},
		{name: "bad duration in env shedding", env: map[string]string{"SPILLWAY_SHEDDING_PRIORITY_WINDOW": "1 fortnight"},
			want: []string{"shedding.priority.window", "SPILLWAY_SHEDDING_PRIORITY_WINDOW"}},
		{name: "bad value in env retry", env: map[string]string{"SPILLWAY_RETRY_DISABLED": "false", "SPILLWAY_RETRY_MAX_ATTEMPTS": "-3"},
			want: []string{`config: retry.max_attempts: must be positive, got "-3"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			path := ""
			if tc.yaml != "" {
				path = writeConfig(t, tc.yaml)
			}
			_, err := LoadConfig(path)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if tc.secret != "" && strings.Contains(err.Error(), tc.secret) {
				t.Errorf("secret in error %q", err)
			}
		})
	}
}

func TestSecretsRedacted(t *testing.T) {
	c := Config{Broker: brokerKafka}
	c.Kafka.SASL = kafkabroker.SASLConfig{Mechanism: "PLAIN", User: "svc", Password: "hunter2"}
	c.Kafka.TLS = spillway.TLSConfig{Enabled: true, CertFile: "c.pem", KeyPEM: "-----BEGIN PRIVATE KEY-----xyz"}
	c.Redis.Password = "redis-pass"
	for _, s := range []string{c.String(), fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c),
		fmt.Sprintf("%v", c.Kafka), fmt.Sprintf("%+v", c.Kafka.SASL), fmt.Sprintf("%#v", c.Kafka.TLS)} {
		for _, secret := range []string{"hunter2", "PRIVATE KEY", "xyz", "redis-pass"} {
			if strings.Contains(s, secret) {
				t.Errorf("%q leaks in %s", secret, s)
			}
		}
	}
	if !strings.Contains(c.String(), "password: '[redacted]'") || !strings.Contains(c.String(), "user: svc") {
		t.Errorf("String() = %s", c)
	}
}

// TestEnvKeysMatchEnvLibrary: the variable names the error attribution
// computes are the ones caarlos0/env reads, and every leaf has one.
func TestEnvKeysMatchEnvLibrary(t *testing.T) {
	params, err := env.GetFieldParamsWithOptions(&Config{}, env.Options{Prefix: envVarPrefix})
	if err != nil {
		t.Fatal(err)
	}
	var theirs, ours []string
	for _, p := range params {
		theirs = append(theirs, p.Key)
	}
	for _, l := range leaves() {
		ours = append(ours, l.env)
	}
	sort.Strings(theirs)
	sort.Strings(ours)
	if !reflect.DeepEqual(theirs, ours) {
		t.Errorf("env keys differ:\nenv:  %v\nours: %v", theirs, ours)
	}
	for _, want := range []string{"SPILLWAY_BROKER", "SPILLWAY_KAFKA_BROKERS", "SPILLWAY_BUDGET_VERTICES", "SPILLWAY_KAFKA_SASL_PASSWORD",
		"SPILLWAY_SHEDDING_TOPICS", "SPILLWAY_SHEDDING_PRIORITY_WINDOW", "SPILLWAY_RETRY_DISABLED", "SPILLWAY_RETRY_MAX_ATTEMPTS",
		"SPILLWAY_RETRY_RETRY_RATE", "SPILLWAY_BUDGET_AUTOSIZE_ENABLED", "SPILLWAY_BUDGET_AUTOSIZE_FLOOR"} {
		if sort.SearchStrings(ours, want) == len(ours) || ours[sort.SearchStrings(ours, want)] != want {
			t.Errorf("no variable %s", want)
		}
	}
}

func TestNewRejects(t *testing.T) {
	var addrErr *spillway.FieldError
	if _, err := New(Config{Broker: brokerRedis}, nil); !errors.As(err, &addrErr) || addrErr.Field != "redis.addr" {
		t.Errorf("redis without addr: %v", err)
	}
	if _, err := New(Config{Budget: BudgetConfig{Vertices: -1}}, nil); err == nil {
		t.Error("invalid config accepted")
	}
	c := Config{Broker: brokerKafka}
	c.Kafka.Brokers = []string{"127.0.0.1:1"}
	c.Kafka.TLS = spillway.TLSConfig{Enabled: true, CAFile: filepath.Join(t.TempDir(), "missing.pem")}
	_, err := New(c, nil)
	var ce *spillway.FieldError
	if !errors.As(err, &ce) || ce.Field != "kafka.tls.ca_file" {
		t.Errorf("missing CA file: %v", err)
	}
}

// TestRedisSection: the redis section from YAML and environment, its
// redelivery deadline, and its validation.
func TestRedisSection(t *testing.T) {
	clearEnv(t)
	p := writeConfig(t, `broker: redis
redis:
  addr: redis.internal:6380
  password: s3cret
  consumers: 8
  max_idle_time: 45s
  max_len: {positions: 1000}
telemetry:
  lag_interval: 2s
`)
	t.Setenv("SPILLWAY_REDIS_CONSUMER_GROUP", "tiler")
	t.Setenv("SPILLWAY_REDIS_DEFAULT_MAX_LEN", "5000")
	c, err := LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Redis
	if r.Addr != "redis.internal:6380" || r.Password != "s3cret" || r.Consumers != 8 || r.ConsumerGroup != "tiler" ||
		r.DefaultMaxLen != 5000 || r.MaxLen["positions"] != 1000 || r.KeepAlive.Interval != 15*time.Second {
		t.Errorf("redis section = %+v", r)
	}
	if d := c.RedeliveryDeadline(); d != 45*time.Second {
		t.Errorf("RedeliveryDeadline = %s, want redis.max_idle_time 45s", d)
	}
	if c.Telemetry.LagInterval != 2*time.Second {
		t.Errorf("telemetry.lag_interval = %s", c.Telemetry.LagInterval)
	}
	if strings.Contains(c.String(), "s3cret") || strings.Contains(fmt.Sprintf("%+v %#v", c, c), "s3cret") {
		t.Error("redis.password printed")
	}
	bc := redisGroupConfig(r, redisGroup(r, "h"))
	if bc.Password != "s3cret" || bc.ConsumerGroup != "tiler.h" || bc.MaxIdleTime != 45*time.Second || bc.Validate() != nil {
		t.Errorf("redisbroker config = %v (%v)", bc, bc.Validate())
	}

	bad := Config{Broker: brokerRedis}
	bad.Redis = redisbroker.Config{Addr: "nohost", Consumers: 2000, MaxIdleTime: 3 * time.Second, KeepAlive: redisbroker.KeepAliveConfig{Interval: 5 * time.Second}}
	bad.Redis.MaxLen = map[string]int64{"x": -1}
	fields := map[string]bool{}
	for _, e := range bad.Validate().(interface{ Unwrap() []error }).Unwrap() {
		var ce *spillway.FieldError
		if errors.As(e, &ce) {
			fields[ce.Field] = true
		}
	}
	for _, f := range []string{"redis.addr", "redis.consumers", "redis.keep_alive.interval", "redis.max_len.x"} {
		if !fields[f] {
			t.Errorf("no error for %s (got %v)", f, fields)
		}
	}
	// "embedded" needs the embedded package's registration: without it
	// the error names the import; with it, the address validates.
	// A read's entries count from when it was sent: block_time must stay
	// well below the time an entry may go without a refresh.
	slow := Config{Broker: brokerRedis, Redis: redisbroker.Config{Addr: "h:1", MaxIdleTime: time.Second}}
	var fe *spillway.FieldError
	if err := slow.Validate(); !errors.As(err, &fe) || fe.Field != "redis.block_time" || fe.Value != "500ms" {
		t.Errorf("redis.max_idle_time 1s with the default block_time: %v, want an error on redis.block_time", err)
	}
	emb := Config{Broker: brokerRedis, Redis: redisbroker.Config{Addr: "embedded"}}
	if err := emb.Validate(); err == nil || !strings.Contains(err.Error(), `import _ "github.com/spillway-go/spillway/embedded"`) {
		t.Errorf("redis.addr embedded with nothing registered: %v, want an error naming the import", err)
	}
	embedreg.RegisterRedis(func() (string, func(), error) { return "", nil, errors.New("not started in this test") })
	defer embedreg.RegisterRedis(nil)
	if err := emb.Validate(); err != nil {
		t.Errorf("redis.addr embedded rejected once registered: %v", err)
	}
}

// TestRetryDefaultsFitTheDeadline: the retry gate is on by default, and
// its time bounds default to fit the broker's redelivery deadline, so a
// short deadline needs no retry settings; kafka.consumer key defers by
// nack, which keeps key order.
func TestRetryDefaultsFitTheDeadline(t *testing.T) {
	c := Config{Broker: brokerRedis}
	c.Redis.Addr = "r:6379"
	c.Redis.MaxIdleTime = 8 * time.Second
	if err := c.Validate(); err != nil {
		t.Fatalf("redis.max_idle_time 8s with the default retry section: %v", err)
	}
	c.setDefaults()
	if c.Retry.Disabled || c.Retry.MaxElapsedTime != 2*time.Second || c.Retry.MaxInterval != time.Second || c.Retry.InitialInterval != 100*time.Millisecond {
		t.Errorf("retry under an 8s deadline: %+v", c.Retry)
	}
	k := Config{Broker: brokerKafka}
	k.Kafka.Brokers = []string{"k:9092"}
	k.setDefaults()
	if k.Retry.MaxElapsedTime != 10*time.Second || k.Retry.MaxInterval != 5*time.Second || k.Retry.Defer != retrygate.DeferRepublish {
		t.Errorf("retry under kafka's default 60s deadline: %+v", k.Retry)
	}
	k.Kafka.Consumer = kafkabroker.ConsumerKey
	k.Retry.Defer = ""
	k.setDefaults()
	if k.Retry.Defer != retrygate.DeferNack {
		t.Errorf("retry.defer with kafka.consumer key = %q, want nack", k.Retry.Defer)
	}
}

// TestRedisBadIdleTimeNamesOnlyThatField: a bad redis.max_idle_time is
// reported on that field alone, not also on keep_alive.interval, which the
// user did not set and which is derived from it (issue 34, item 5).
func TestRedisBadIdleTimeNamesOnlyThatField(t *testing.T) {
	clearEnv(t)
	p := writeConfig(t, `broker: redis
redis:
  addr: redis.internal:6379
  max_idle_time: -1s
`)
	_, err := LoadConfig(p)
	if err == nil {
		t.Fatal("redis.max_idle_time -1s accepted")
	}
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *spillway.FieldError
		if errors.As(e, &fe) {
			fields = append(fields, fe.Field)
		}
	}
	if !slices.Equal(fields, []string{"redis.max_idle_time"}) {
		t.Errorf("fields reported = %v, want only redis.max_idle_time (%v)", fields, err)
	}
	// A keep-alive interval the user did set is still checked.
	p = writeConfig(t, `broker: redis
redis:
  addr: redis.internal:6379
  max_idle_time: -1s
  keep_alive: {interval: -1s}
`)
	_, err = LoadConfig(p)
	if err == nil || !strings.Contains(err.Error(), "redis.keep_alive.interval") || !strings.Contains(err.Error(), "redis.max_idle_time") {
		t.Errorf("both set wrong: %v, want errors on both fields", err)
	}
}
