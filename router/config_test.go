package router

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
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
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, EnvPrefix) {
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
	want := Config{Broker: BrokerMemory, CloseTimeout: 30 * time.Second}
	want.Budget.Vertices = 200_000
	want.Kafka = KafkaConfig{
		Brokers: []string{"embedded"}, ConsumerGroup: "spillway", Partitions: 12, ReplicationFactor: 1,
		KeyMetadata: "entity_id", Version: "2.3.0", ClientID: "spillway", ChannelBufferSize: 16,
		FetchDefaultBytes: 256 << 10, RebalanceTimeout: 60 * time.Second, SessionTimeout: 10 * time.Second,
		HeartbeatInterval: time.Second, InitialOffset: "oldest", NackResendSleep: 100 * time.Millisecond,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n%v\nwant\n%v", c, want)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config does not validate: %v", err)
	}
	kc := Config{Broker: BrokerKafka}
	if err := kc.Validate(); err != nil {
		t.Errorf("zero kafka Config does not validate: %v", err)
	}
	if d := kc.RedeliveryDeadline(); d != 60*time.Second {
		t.Errorf("RedeliveryDeadline = %s", d)
	}
}

// TestValidateNamesFieldAndValue: every field's bad value gives an error
// naming the field and the value.
func TestValidateNamesFieldAndValue(t *testing.T) {
	kafka := func(f func(*KafkaConfig)) Config {
		c := Config{Broker: BrokerKafka}
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
		{"brokers", kafka(func(k *KafkaConfig) { k.Brokers = []string{"no-port"} }), "kafka.brokers[0]", "no-port"},
		{"embedded mixed", kafka(func(k *KafkaConfig) { k.Brokers = []string{"a:1", "embedded"} }), "kafka.brokers[1]", "embedded"},
		{"group", kafka(func(k *KafkaConfig) { k.ConsumerGroup = "  " }), "kafka.consumer_group", "  "},
		{"topics", kafka(func(k *KafkaConfig) { k.Topics = []string{"ok", ""} }), "kafka.topics[1]", ""},
		{"partitions", kafka(func(k *KafkaConfig) { k.Partitions = -3 }), "kafka.partitions", "-3"},
		{"replication", kafka(func(k *KafkaConfig) { k.ReplicationFactor = -1 }), "kafka.replication_factor", "-1"},
		{"version", kafka(func(k *KafkaConfig) { k.Version = "latest" }), "kafka.version", "latest"},
		{"old version", kafka(func(k *KafkaConfig) { k.Version = "0.10.0" }), "kafka.version", "0.10.0"},
		{"embedded version", Config{Broker: BrokerKafka, Kafka: KafkaConfig{Version: "3.6.0"}}, "kafka.version", "3.6.0"},
		{"buffer", kafka(func(k *KafkaConfig) { k.ChannelBufferSize = -1 }), "kafka.channel_buffer_size", "-1"},
		{"fetch", kafka(func(k *KafkaConfig) { k.FetchDefaultBytes = -1 }), "kafka.fetch_default_bytes", "-1"},
		{"rebalance", kafka(func(k *KafkaConfig) { k.RebalanceTimeout = -time.Second }), "kafka.rebalance_timeout", "-1s"},
		{"rebalance precision", kafka(func(k *KafkaConfig) { k.RebalanceTimeout = 1500 * time.Microsecond }), "kafka.rebalance_timeout", "1.5ms"},
		{"session", kafka(func(k *KafkaConfig) { k.SessionTimeout = -time.Second }), "kafka.session_timeout", "-1s"},
		{"heartbeat", kafka(func(k *KafkaConfig) { k.HeartbeatInterval = -time.Second }), "kafka.heartbeat_interval", "-1s"},
		{"heartbeat vs session", kafka(func(k *KafkaConfig) { k.HeartbeatInterval = 20 * time.Second }), "kafka.heartbeat_interval", "20s"},
		{"initial offset", kafka(func(k *KafkaConfig) { k.InitialOffset = "earliest" }), "kafka.initial_offset", "earliest"},
		{"nack sleep", kafka(func(k *KafkaConfig) { k.NackResendSleep = -time.Second }), "kafka.nack_resend_sleep", "-1s"},
		{"tls cert without key", kafka(func(k *KafkaConfig) { k.TLS = TLSConfig{Enabled: true, CertFile: "c.pem"} }), "kafka.tls.cert_file", "c.pem"},
		{"tls key without cert", kafka(func(k *KafkaConfig) { k.TLS = TLSConfig{Enabled: true, KeyFile: "k.pem"} }), "kafka.tls.key_file", "k.pem"},
		{"tls two keys", kafka(func(k *KafkaConfig) {
			k.TLS = TLSConfig{Enabled: true, CertFile: "c.pem", KeyFile: "k.pem", KeyPEM: "-----BEGIN PRIVATE KEY-----"}
		}), "kafka.tls.key_pem", "[redacted]"},
		{"tls disabled", kafka(func(k *KafkaConfig) { k.TLS = TLSConfig{CAFile: "ca.pem"} }), "kafka.tls.enabled", "false"},
		{"sasl mechanism", kafka(func(k *KafkaConfig) { k.SASL = SASLConfig{Mechanism: "GSSAPI", User: "u", Password: "p"} }), "kafka.sasl.mechanism", "GSSAPI"},
		{"sasl user", kafka(func(k *KafkaConfig) { k.SASL = SASLConfig{Mechanism: "PLAIN", Password: "hunter2"} }), "kafka.sasl.user", ""},
		{"sasl password", kafka(func(k *KafkaConfig) { k.SASL = SASLConfig{Mechanism: "SCRAM-SHA-512", User: "u"} }), "kafka.sasl.password", ""},
		{"sasl without mechanism", kafka(func(k *KafkaConfig) { k.SASL = SASLConfig{User: "u", Password: "hunter2"} }), "kafka.sasl.mechanism", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil {
				t.Fatal("no error")
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *ConfigError", err)
			}
			if ce.Field != tc.field || ce.Value != tc.value {
				t.Errorf("got field %q value %q, want %q %q (%v)", ce.Field, ce.Value, tc.field, tc.value, err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "router: config: "+tc.field+": ") || !strings.Contains(msg, fmt.Sprintf("got %q", tc.value)) {
				t.Errorf("message %q does not name field and value", msg)
			}
			if strings.Contains(msg, "hunter2") || strings.Contains(msg, "BEGIN PRIVATE KEY") {
				t.Errorf("secret in error: %q", msg)
			}
		})
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
	if c.Broker != BrokerKafka || c.Budget.Vertices != 50000 || c.Kafka.RebalanceTimeout != 20*time.Second ||
		c.Kafka.Partitions != 6 || !reflect.DeepEqual(c.Kafka.Brokers, []string{"k1:9092", "k2:9092"}) {
		t.Errorf("file not applied: %v", c)
	}
	if c.Kafka.SessionTimeout != DefaultSessionTimeout {
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
	if c, err = LoadConfig(path); err != nil || c.Broker != BrokerMemory {
		t.Errorf("SPILLWAY_BROKER: %v, %v", c.Broker, err)
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
		{name: "validation after file", yaml: "broker: kafka\nkafka:\n  rebalance_timeout: -1s\n", want: []string{`router: config: kafka.rebalance_timeout: must be positive, got "-1s"`}},
		{name: "bad duration in env", env: map[string]string{"SPILLWAY_KAFKA_REBALANCE_TIMEOUT": "abc"},
			want: []string{"kafka.rebalance_timeout", "SPILLWAY_KAFKA_REBALANCE_TIMEOUT", `"abc"`}},
		{name: "bad int in env", env: map[string]string{"SPILLWAY_BUDGET_VERTICES": "1e9x"},
			want: []string{"budget.vertices", "SPILLWAY_BUDGET_VERTICES", `"1e9x"`}},
		{name: "bad bool in env", env: map[string]string{"SPILLWAY_KAFKA_TLS_ENABLED": "yes please"},
			want: []string{"kafka.tls.enabled", `"yes please"`}},
		{name: "bad broker in env", env: map[string]string{"SPILLWAY_BROKER": "nats"}, want: []string{"broker", `"nats"`}},
		{name: "secret in file", yaml: "kafka:\n  sasl:\n    password: [hunter2]\n", want: []string{"kafka.sasl.password"}, secret: "hunter2"},
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
	c := Config{Broker: BrokerKafka}
	c.Kafka.SASL = SASLConfig{Mechanism: "PLAIN", User: "svc", Password: "hunter2"}
	c.Kafka.TLS = TLSConfig{Enabled: true, CertFile: "c.pem", KeyPEM: "-----BEGIN PRIVATE KEY-----xyz"}
	c.Redis.AuthPassword = "redis-pass"
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
	if Secret("").String() != "" {
		t.Error("an empty secret should print empty")
	}
}

// TestEnvKeysMatchEnvLibrary: the variable names the error attribution
// computes are the ones caarlos0/env reads, and every leaf has one.
func TestEnvKeysMatchEnvLibrary(t *testing.T) {
	params, err := env.GetFieldParamsWithOptions(&Config{}, env.Options{Prefix: EnvPrefix})
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
	for _, want := range []string{"SPILLWAY_BROKER", "SPILLWAY_KAFKA_BROKERS", "SPILLWAY_BUDGET_VERTICES", "SPILLWAY_KAFKA_SASL_PASSWORD"} {
		if sort.SearchStrings(ours, want) == len(ours) || ours[sort.SearchStrings(ours, want)] != want {
			t.Errorf("no variable %s", want)
		}
	}
}

func TestSizeBudget(t *testing.T) {
	if got := SizeBudget(10_000, 60*time.Second); got != 300_000 {
		t.Errorf("SizeBudget(10k/s, 60s) = %d", got)
	}
	if got := SizeBudget(0, time.Second); got != 1 {
		t.Errorf("SizeBudget(0) = %d", got)
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := New(Config{Broker: BrokerRedis}, nil); !errors.Is(err, ErrNotSupported) {
		t.Errorf("redis: %v", err)
	}
	if _, err := New(Config{Budget: BudgetConfig{Vertices: -1}}, nil); err == nil {
		t.Error("invalid config accepted")
	}
	c := Config{Broker: BrokerKafka}
	c.Kafka.Brokers = []string{"127.0.0.1:1"}
	c.Kafka.TLS = TLSConfig{Enabled: true, CAFile: filepath.Join(t.TempDir(), "missing.pem")}
	_, err := New(c, nil)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "kafka.tls.ca_file" {
		t.Errorf("missing CA file: %v", err)
	}
}
