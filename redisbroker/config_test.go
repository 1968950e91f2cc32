package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

func TestConfigDefaults(t *testing.T) {
	c := redisbroker.Config{Addr: "localhost:6379", ConsumerGroup: "g"}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Consumers != redisbroker.DefaultConsumers || c.BlockTime != redisbroker.DefaultBlockTime ||
		c.ClaimInterval != redisbroker.DefaultClaimInterval || c.MaxIdleTime != redisbroker.DefaultMaxIdleTime ||
		c.KeepAlive.Interval != redisbroker.DefaultMaxIdleTime/3 || c.KeepAlive.MaxInFlight != redisbroker.DefaultMaxInFlight ||
		c.NackResendSleep != redisbroker.DefaultNackResendSleep ||
		c.DeadLetterTopic != redisbroker.DefaultDeadLetterTopic || c.Consumer != redisbroker.DefaultConsumerName() {
		t.Fatalf("defaults = %v", c)
	}
}

func TestConsumerNames(t *testing.T) {
	one := redisbroker.Config{Consumer: "svc", Consumers: 1}.ConsumerNames()
	if len(one) != 1 || one[0] != "svc" {
		t.Fatalf("one consumer: %v", one)
	}
	three := redisbroker.Config{Consumer: "svc", Consumers: 3}.ConsumerNames()
	if strings.Join(three, ",") != "svc-0,svc-1,svc-2" {
		t.Fatalf("three consumers: %v", three)
	}
	n := redisbroker.DefaultConsumerName()
	if n != redisbroker.DefaultConsumerName() || strings.ContainsAny(n, " /:") || !strings.Contains(n, "-") {
		t.Fatalf("DefaultConsumerName() = %q: want stable, host-program, no separators", n)
	}
}

func TestConfigValidateNamesFieldAndValue(t *testing.T) {
	base := redisbroker.Config{Addr: "127.0.0.1:6379", ConsumerGroup: "g"}
	cases := []struct {
		mutate       func(*redisbroker.Config)
		field, value string
	}{
		{func(c *redisbroker.Config) { c.Addr = "" }, "Addr", ""},
		{func(c *redisbroker.Config) { c.Addr = "no-port" }, "Addr", "no-port"},
		{func(c *redisbroker.Config) { c.Addr = "h:0" }, "Addr", "h:0"},
		{func(c *redisbroker.Config) { c.DB = -1 }, "DB", "-1"},
		{func(c *redisbroker.Config) { c.ConsumerGroup = "" }, "ConsumerGroup", ""},
		{func(c *redisbroker.Config) { c.Consumers = -2 }, "Consumers", "-2"},
		{func(c *redisbroker.Config) { c.Consumer = "a b" }, "Consumer", "a b"},
		{func(c *redisbroker.Config) { c.BlockTime = time.Microsecond }, "BlockTime", "1µs"},
		{func(c *redisbroker.Config) { c.MaxIdleTime = time.Second; c.KeepAlive.Interval = 2 * time.Second }, "KeepAlive.Interval", "2s"},
		{func(c *redisbroker.Config) { c.MaxIdleTime = time.Second }, "BlockTime", "500ms"}, // (1s - 333ms) / 2 < 500ms
		{func(c *redisbroker.Config) { c.KeepAlive.MaxInFlight = -time.Second }, "KeepAlive.MaxInFlight", "-1s"},
		{func(c *redisbroker.Config) { c.DefaultMaxLen = -5 }, "DefaultMaxLen", "-5"},
		{func(c *redisbroker.Config) { c.MaxLen = map[string]int64{"ok": 1, "bad": -1} }, `MaxLen["bad"]`, "-1"},
		{func(c *redisbroker.Config) { c.TLS.CertFile = "c.pem" }, "TLS.CertFile/KeyFile", "c.pem/"},
		{func(c *redisbroker.Config) { c.TLS.KeyPEM = "k" }, "TLS.CertFile/KeyFile", "/"},
		{func(c *redisbroker.Config) { c.TLS.CertFile, c.TLS.KeyFile, c.TLS.KeyPEM = "c.pem", "k.pem", "k" }, "TLS.KeyPEM", spillway.Secret("k").String()},
		{func(c *redisbroker.Config) { c.Addr = spillway.Embedded; c.TLS.Enabled = true }, "TLS", "enabled"},
	}
	for _, tc := range cases {
		c := base
		tc.mutate(&c)
		err := c.Validate()
		var fe *spillway.FieldError
		if !errors.Is(err, spillway.ErrInvalidConfig) || !errors.As(err, &fe) || fe.Field != tc.field || fe.Value != tc.value {
			t.Errorf("Validate() = %v; want a FieldError on %s = %q", err, tc.field, tc.value)
		}
	}
	// A publisher does not need a group.
	p, err := redisbroker.NewPublisher(redisbroker.Config{Addr: "127.0.0.1:1"})
	if err != nil {
		t.Fatalf("publisher without group: %v", err)
	}
	_ = p.Close()
	if _, err := redisbroker.NewSubscriber(redisbroker.Config{Addr: "127.0.0.1:1"}); !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Fatalf("subscriber without group: %v", err)
	}
	// Disabled keep-alive skips its checks.
	c := base
	c.MaxIdleTime = time.Second
	c.KeepAlive = redisbroker.KeepAliveConfig{Interval: time.Hour, Disabled: true}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

const secret = "hunter2-very-secret"

// The password (and an inline TLS key) appears in no rendering of the
// configuration and in no error.
func TestPasswordNeverShown(t *testing.T) {
	c := redisbroker.Config{Addr: "127.0.0.1:6379", Username: "svc", Password: secret, ConsumerGroup: "g"}
	c.TLS.KeyPEM = secret + "-key"
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v", c, c, c), fmt.Sprint(&c)} {
		if strings.Contains(s, secret) {
			t.Fatalf("password shown: %s", s)
		}
		if !strings.Contains(s, "[redacted]") {
			t.Fatalf("no redaction marker: %s", s)
		}
	}
	c.DB = -1
	if err := c.Validate(); err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("Validate error = %v", err)
	}
}

// AUTH from the config; a wrong password fails without being echoed.
func TestAuth(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.WithPassword(secret))
	cfg := testConfig(srv)
	cfg.Password = secret
	roundTrip(t, cfg)

	bad := cfg
	bad.Password = secret + "-wrong"
	pub := newPublisher(t, bad)
	err := pub.Publish(uniq("auth"), message.NewMessage("x", nil))
	if err == nil {
		t.Fatal("publish with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("error shows the password: %v", err)
	}
}

// TLS with a private CA and a client certificate (tls-auth-clients yes).
func TestTLS(t *testing.T) {
	t.Parallel()
	files := redistest.GenerateTLS(t)
	files.ClientAuth = true
	srv := redistest.Start(t, redistest.WithTLS(files))
	cfg := testConfig(srv)
	cfg.TLS = spillway.TLSConfig{CAFile: files.CA, CertFile: files.ClientCert, KeyFile: files.ClientKey}
	roundTrip(t, cfg)

	inline := cfg // the key inline instead of in a file
	key, err := os.ReadFile(files.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	inline.TLS.KeyFile, inline.TLS.KeyPEM = "", spillway.Secret(key)
	roundTrip(t, inline)

	noCert := cfg
	noCert.TLS.CertFile, noCert.TLS.KeyFile = "", ""
	if err := newPublisher(t, noCert).Publish(uniq("tls"), message.NewMessage("x", nil)); err == nil {
		t.Fatal("publish without a client certificate succeeded")
	}
	badCA := cfg
	badCA.TLS.CAFile = files.ClientCert + ".missing"
	if _, err := redisbroker.NewPublisher(badCA); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}

// DB from the config: entries land in the selected database.
func TestDB(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.DB = 3
	topic := roundTrip(t, cfg)
	raw := rawClient(t, srv) // DB 0
	if n, _ := raw.Exists(context.Background(), topic).Result(); n != 0 {
		t.Fatal("stream written to DB 0")
	}
}

// roundTrip publishes and consumes one message with cfg, returning the topic.
func roundTrip(t *testing.T, cfg redisbroker.Config) string {
	t.Helper()
	topic := uniq("rt")
	sub := newSubscriber(t, cfg)
	ch := subscribe(t, sub, topic)
	publish(t, newPublisher(t, cfg), topic, "hello")
	select {
	case m := <-ch:
		if m.UUID != "hello" || string(m.Payload) != "payload-hello" {
			t.Fatalf("got %s %q", m.UUID, m.Payload)
		}
		m.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	return topic
}
