package router

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/redisbroker"
)

// TestEmbeddedLibraryConfigs: the redis and budget.autosize sections are
// redisbroker.Config and sizing.Config, and their keys still load from
// YAML and the environment; code (the budget, the resize hook) is no key; the
// password is a spillway.Secret everywhere it travels.
func TestEmbeddedLibraryConfigs(t *testing.T) {
	clearEnv(t)
	p := writeConfig(t, `broker: redis
redis:
  addr: r:6379
  password: pw-from-file
  tls: {server_name: redis.internal}
  keep_alive: {max_in_flight: 2m}
budget:
  autosize:
    enabled: true
    floor: 10
    ceiling: 5000
    window: 3s
    memory_bytes: 1000000
    bytes_per_vertex: 10
`)
	t.Setenv("SPILLWAY_BUDGET_AUTOSIZE_TAIL_SHARE", "0.5")
	t.Setenv("SPILLWAY_REDIS_CLAIM_INTERVAL", "2s")
	c, src, err := LoadConfigSources(p)
	if err != nil {
		t.Fatal(err)
	}
	var rc redisbroker.Config = c.Redis // the same type
	if rc.Addr != "r:6379" || rc.Password != spillway.Secret("pw-from-file") || rc.TLS.ServerName != "redis.internal" ||
		rc.KeepAlive.MaxInFlight != 2*time.Minute || rc.ClaimInterval != 2*time.Second {
		t.Errorf("redis = %v", rc)
	}
	if rc.ConsumerGroup != defaultConsumerGroup || rc.Consumer != "" {
		t.Errorf("consumer_group %q, consumer %q: want the router's prefix default and an empty consumer", rc.ConsumerGroup, rc.Consumer)
	}
	a := c.Budget.AutoSize
	if !a.Enabled || a.Floor != 10 || a.Ceiling != 5000 || a.Window != 3*time.Second || a.TailShare != 0.5 || a.memoryBound() != 100_000 {
		t.Errorf("budget.autosize = %+v", a)
	}
	for key, want := range map[string]string{
		"budget.autosize.floor":      p + ":10",
		"budget.autosize.tail_share": "env SPILLWAY_BUDGET_AUTOSIZE_TAIL_SHARE",
		"redis.claim_interval":       "env SPILLWAY_REDIS_CLAIM_INTERVAL",
		"redis.password":             p + ":4",
	} {
		if src[key] != want {
			t.Errorf("source of %s = %q, want %q", key, src[key], want)
		}
	}
	for _, l := range leaves() {
		for _, code := range []string{"budget.autosize.budget", "budget.autosize.estimator", "budget.autosize.on_resize", "budget.autosize.-"} {
			if l.path == code {
				t.Errorf("%s is a configuration key", code)
			}
		}
		if l.path == "redis.password" && !l.secret {
			t.Error("redis.password is not treated as a secret")
		}
	}
	if s := c.String(); strings.Contains(s, "pw-from-file") || strings.Contains(fmt.Sprintf("%v %#v", redisGroupConfig(c.Redis, "g"), redisGroupConfig(c.Redis, "g")), "pw-from-file") {
		t.Errorf("password printed: %s", s)
	}
	if string(redisGroupConfig(c.Redis, "g").Password) != "pw-from-file" {
		t.Error("the password does not reach redisbroker")
	}

	// The budget the sizer resizes is not a key, and a bad password value
	// is never quoted.
	p = writeConfig(t, "budget:\n  autosize:\n    budget: 5\nredis:\n  password: [a, b]\n")
	_, err = LoadConfig(p)
	var ce *spillway.FieldError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "budget.autosize.budget") || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("budget.autosize.budget: %v, want an unknown field error", err)
	}
	if !strings.Contains(err.Error(), "redis.password") {
		t.Errorf("redis.password as a list: %v, want an error naming it", err)
	}
}
