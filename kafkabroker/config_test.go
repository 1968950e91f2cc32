package kafkabroker_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/kafkabroker"
)

func TestDefaultVersion(t *testing.T) {
	ext := kafkabroker.Config{Brokers: []string{"k1:9092"}}.WithDefaults()
	if ext.Version != "3.6.0" {
		t.Errorf("external cluster default version %q, want 3.6.0", ext.Version)
	}
	v, err := sarama.ParseKafkaVersion(ext.Version)
	if err != nil || !v.IsAtLeast(sarama.MinVersion) || !sarama.MaxVersion.IsAtLeast(v) {
		t.Errorf("default version %v is not one Sarama knows (%v to %v): %v", v, sarama.MinVersion, sarama.MaxVersion, err)
	}
	emb := kafkabroker.Config{Brokers: []string{spillway.Embedded}}.WithDefaults()
	if emb.Version != kafkabroker.EmbeddedVersion {
		t.Errorf("embedded default version %q, want %q", emb.Version, kafkabroker.EmbeddedVersion)
	}
	if err := (kafkabroker.Config{Brokers: []string{"k1:9092"}}).Validate(); err != nil {
		t.Errorf("brokers alone do not validate: %v", err)
	}
}

// TestValidateFields: each bad value is a *FieldError wrapping
// ErrInvalidConfig, named relative to the section.
func TestValidateFields(t *testing.T) {
	with := func(f func(*kafkabroker.Config)) kafkabroker.Config {
		c := kafkabroker.Config{Brokers: []string{"k1:9092"}}
		f(&c)
		return c
	}
	cases := []struct {
		cfg   kafkabroker.Config
		field string
		value string
	}{
		{kafkabroker.Config{}, "brokers", ""},
		{with(func(c *kafkabroker.Config) { c.Brokers = []string{"no-port"} }), "brokers[0]", "no-port"},
		{with(func(c *kafkabroker.Config) { c.Brokers = []string{"a:1", "embedded"} }), "brokers[1]", "embedded"},
		{with(func(c *kafkabroker.Config) { c.Version = "latest" }), "version", "latest"},
		{with(func(c *kafkabroker.Config) { c.Version = "0.10.0" }), "version", "0.10.0"},
		{kafkabroker.Config{Brokers: []string{"embedded"}, Version: "3.6.0"}, "version", "3.6.0"},
		{with(func(c *kafkabroker.Config) { c.HeartbeatInterval = 20 * time.Second }), "heartbeat_interval", "20s"},
		{with(func(c *kafkabroker.Config) { c.InitialOffset = "earliest" }), "initial_offset", "earliest"},
		{with(func(c *kafkabroker.Config) {
			c.TLS = spillway.TLSConfig{Enabled: true, CertFile: "c.pem", KeyFile: "k.pem", KeyPEM: "-----BEGIN PRIVATE KEY-----"}
		}), "tls.key_pem", "[redacted]"},
		{with(func(c *kafkabroker.Config) { c.SASL.Mechanism = "GSSAPI" }), "sasl.mechanism", "GSSAPI"},
		{with(func(c *kafkabroker.Config) { c.Consumer = "unordered" }), "consumer", "unordered"},
		{with(func(c *kafkabroker.Config) { c.WindowMessages = -1 }), "window_messages", "-1"},
		{with(func(c *kafkabroker.Config) { c.WindowBytes = -2 }), "window_bytes", "-2"},
		{with(func(c *kafkabroker.Config) { c.Partitioner = "fnv" }), "partitioner", "fnv"},
		{with(func(c *kafkabroker.Config) { c.IsolationLevel = "committed" }), "isolation_level", "committed"},
		{with(func(c *kafkabroker.Config) { c.Version = "0.10.2.0" }), "isolation_level", "read_committed"},
	}
	for _, tc := range cases {
		err := tc.cfg.Validate()
		if !errors.Is(err, spillway.ErrInvalidConfig) {
			t.Errorf("%s: %v does not wrap ErrInvalidConfig", tc.field, err)
			continue
		}
		found := false
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			var fe *spillway.FieldError
			if errors.As(e, &fe) && fe.Field == tc.field && fe.Value == tc.value {
				found = true
			}
		}
		if !found {
			t.Errorf("want a FieldError for %s = %q, got %v", tc.field, tc.value, err)
		}
	}
}

func TestSecretRedacted(t *testing.T) {
	c := kafkabroker.Config{SASL: kafkabroker.SASLConfig{Mechanism: "PLAIN", User: "svc", Password: "hunter2"}}
	c.TLS.KeyPEM = "-----BEGIN PRIVATE KEY-----xyz"
	for _, s := range []string{fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c)} {
		if strings.Contains(s, "hunter2") || strings.Contains(s, "xyz") {
			t.Errorf("secret printed: %s", s)
		}
	}
}

// TestSaramaConfigs: the backpressure settings reach Sarama, and a TLS
// file that cannot be read is a FieldError naming it.
func TestSaramaConfigs(t *testing.T) {
	c := kafkabroker.Config{Brokers: []string{"k1:9092"}, ChannelBufferSize: 4, FetchDefaultBytes: 1 << 16,
		RebalanceTimeout: 20 * time.Second, InitialOffset: "newest"}
	sc, err := c.SaramaSubscriberConfig()
	if err != nil {
		t.Fatal(err)
	}
	if sc.ChannelBufferSize != 4 || sc.Consumer.Fetch.Default != 1<<16 || sc.Consumer.Group.Rebalance.Timeout != 20*time.Second ||
		sc.Consumer.Offsets.Initial != sarama.OffsetNewest || sc.Version != sarama.V3_6_0_0 || sc.Net.ReadTimeout < 25*time.Second {
		t.Errorf("subscriber config does not carry the section: %+v", sc)
	}
	pc, err := c.SaramaPublisherConfig()
	if err != nil {
		t.Fatal(err)
	}
	if pc.ClientID != kafkabroker.DefaultClientID || !pc.Producer.Return.Successes {
		t.Errorf("publisher config: client id %q, return successes %v", pc.ClientID, pc.Producer.Return.Successes)
	}
	c.TLS = spillway.TLSConfig{Enabled: true, CAFile: filepath.Join(t.TempDir(), "missing.pem")}
	_, err = c.SaramaSubscriberConfig()
	var fe *spillway.FieldError
	if !errors.As(err, &fe) || fe.Field != "tls.ca_file" || !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Errorf("missing CA file: %v", err)
	}
}

// TestMaxMessageBytes: one value sets the producer limit and, with the
// batch headroom, the consumer's fetch limit; negative or oversized values
// are rejected.
func TestMaxMessageBytes(t *testing.T) {
	c := kafkabroker.Config{Brokers: []string{"k1:9092"}, MaxMessageBytes: 4 << 20}
	pc, err := c.SaramaPublisherConfig()
	if err != nil {
		t.Fatal(err)
	}
	if pc.Producer.MaxMessageBytes != 4<<20 {
		t.Errorf("Producer.MaxMessageBytes = %d", pc.Producer.MaxMessageBytes)
	}
	sc, err := c.SaramaSubscriberConfig()
	if err != nil {
		t.Fatal(err)
	}
	if sc.Consumer.Fetch.Max != 4<<20+kafkabroker.BatchHeadroom || sc.Consumer.Fetch.Default != kafkabroker.DefaultFetchDefaultBytes {
		t.Errorf("Fetch.Max = %d, Fetch.Default = %d", sc.Consumer.Fetch.Max, sc.Consumer.Fetch.Default)
	}
	small := kafkabroker.Config{Brokers: []string{"k1:9092"}, MaxMessageBytes: 1000}
	if sc, err := small.SaramaSubscriberConfig(); err != nil || sc.Consumer.Fetch.Default != 1000+kafkabroker.BatchHeadroom {
		t.Errorf("a limit below the fetch size does not cap Fetch.Default: %v", err)
	}
	for _, n := range []int32{-1, int32(sarama.MaxRequestSize)} {
		var fe *spillway.FieldError
		err := kafkabroker.Config{Brokers: []string{"k1:9092"}, MaxMessageBytes: n}.Validate()
		if !errors.As(err, &fe) || fe.Field != "max_message_bytes" {
			t.Errorf("max_message_bytes %d: %v", n, err)
		}
	}
}

// TestIsolationLevel: consumers read committed records only unless told
// otherwise, and the shared client carries the same level (lag is read
// through it).
func TestIsolationLevel(t *testing.T) {
	for _, tc := range []struct {
		level string
		want  sarama.IsolationLevel
	}{{"", sarama.ReadCommitted}, {"read_committed", sarama.ReadCommitted}, {"read_uncommitted", sarama.ReadUncommitted}} {
		c := kafkabroker.Config{Brokers: []string{"k1:9092"}, IsolationLevel: tc.level}
		if err := c.Validate(); err != nil {
			t.Errorf("isolation_level %q: %v", tc.level, err)
		}
		sc, err := c.SaramaSubscriberConfig()
		if err != nil {
			t.Fatal(err)
		}
		ac, err := c.SaramaAdminConfig()
		if err != nil {
			t.Fatal(err)
		}
		if sc.Consumer.IsolationLevel != tc.want || ac.Consumer.IsolationLevel != tc.want {
			t.Errorf("isolation_level %q: consumer %v, shared client %v, want %v", tc.level, sc.Consumer.IsolationLevel, ac.Consumer.IsolationLevel, tc.want)
		}
	}
	// An old version is fine when isolation is not asked for.
	old := kafkabroker.Config{Brokers: []string{"k1:9092"}, Version: "0.10.2.0", IsolationLevel: "read_uncommitted"}
	if err := old.Validate(); err != nil {
		t.Errorf("version 0.10.2.0 with read_uncommitted: %v", err)
	}
}
