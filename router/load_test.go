package router

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
)

// TestLoadConfigAnchors: anchors, aliases and merge keys read as YAML
// defines them, a key written in the mapping winning over a merged one and
// the first of several merged mappings winning over the later ones.
func TestLoadConfigAnchors(t *testing.T) {
	clearEnv(t)
	path := writeConfig(t, `x-timeouts: &timeouts
  session_timeout: 20s
  heartbeat_interval: 2s
  rebalance_timeout: 90s
x-other: &other
  session_timeout: 30s
  client_id: merged
x-brokers: &brokers [k1:9092, k2:9092]
broker: kafka
kafka:
  <<: [*timeouts, *other]
  rebalance_timeout: 120s
  brokers: *brokers
  topics: *brokers
redis: &redis
  addr: r:6379
telemetry:
  <<: {name: inline-merge}
`)
	// x- keys are not fields: the test shows they are reported, then
	// checks the same document without them is read right.
	_, err := LoadConfig(path)
	var ce *spillway.FieldError
	if !errors.As(err, &ce) || ce.Field != "x-timeouts" || !strings.HasPrefix(ce.Reason, "unknown field") {
		t.Fatalf("want an unknown-field error for x-timeouts, got %v", err)
	}

	path = writeConfig(t, `kafka: &k
  session_timeout: 20s
  heartbeat_interval: 2s
  rebalance_timeout: 90s
  client_id: base
  brokers: [k1:9092, k2:9092]
  tls: &tls
    enabled: true
    server_name: base.example
broker: kafka
redis:
  addr: r:6379
  tls:
    <<: *tls
    server_name: override.example
retry: {max_attempts: 4}
shedding:
  priority: &prio
    shed_below: 3
telemetry:
  <<: [{name: first, lag_interval: 7s}, {name: second, lag_threshold: 9}]
  lag_interval: 8s
`)
	c, src, err := LoadConfigSources(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Redis.TLS.ServerName != "override.example" || !c.Redis.TLS.Enabled {
		t.Errorf("redis.tls = %+v, want enabled from the anchor and the server name written", c.Redis.TLS)
	}
	if c.Telemetry.Name != "first" || c.Telemetry.LagThreshold != 9 || c.Telemetry.LagInterval != 8*time.Second {
		t.Errorf("telemetry = %+v, want name first (first merged wins), threshold 9, interval 8s (written wins)", c.Telemetry)
	}
	if src["redis.tls.enabled"] != path+":8" || src["redis.tls.server_name"] != path+":15" || src["telemetry.name"] != path+":21" {
		t.Errorf("sources of merged values: %q %q %q", src["redis.tls.enabled"], src["redis.tls.server_name"], src["telemetry.name"])
	}

	// A whole section by alias.
	path = writeConfig(t, "broker: redis\nredis: &r\n  addr: a:6379\n  consumers: 7\nx: 1\n")
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("unknown key x: %v", err)
	}
	path = writeConfig(t, "base: &r\n  addr: a:6379\n")
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "base") {
		t.Errorf("unknown key base: %v", err)
	}
	path = writeConfig(t, "broker: redis\nredis:\n  <<: &r {addr: a:6379, consumers: 7}\n  max_len: &m {s: 5}\n  default_max_len: 3\n")
	if c, err = LoadConfig(path); err != nil || c.Redis.Addr != "a:6379" || c.Redis.Consumers != 7 || c.Redis.MaxLen["s"] != 5 {
		t.Errorf("anchored flow mapping merged: %+v, %v", c.Redis, err)
	}

	// A merge of something that is not a mapping.
	path = writeConfig(t, "kafka:\n  <<: [1, 2]\n")
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "kafka.<<") || !strings.Contains(err.Error(), "merge key") {
		t.Errorf("merge of a list of scalars: %v", err)
	}
	// An empty section is fine.
	path = writeConfig(t, "kafka:\nredis:\n")
	if _, err := LoadConfig(path); err != nil {
		t.Errorf("empty sections: %v", err)
	}
}

// TestLoadConfigAliasSection: a section given as an alias of an anchored
// mapping elsewhere in a valid document (the anchor on a field of its own).
func TestLoadConfigAliasSection(t *testing.T) {
	clearEnv(t)
	path := writeConfig(t, "shedding:\n  priority: &p\n    shed_below: 3\n    window: 10s\n  topics: [a]\nbroker: memory\n")
	c, err := LoadConfig(path)
	if err != nil || c.Shedding.Priority.ShedBelow != 3 || c.Shedding.Priority.Window != 10*time.Second {
		t.Fatalf("%+v, %v", c.Shedding, err)
	}
	// kafka.tls taken whole from redis.tls by alias.
	path = writeConfig(t, "redis:\n  tls: &t\n    enabled: true\n    server_name: s\nkafka:\n  tls: *t\n")
	if c, err = LoadConfig(path); err != nil || !c.Kafka.TLS.Enabled || c.Kafka.TLS.ServerName != "s" {
		t.Fatalf("%+v, %v", c.Kafka.TLS, err)
	}
}

func TestLoadConfigUnknownEnv(t *testing.T) {
	clearEnv(t)
	t.Setenv("SPILLWAY_KAFKA_BROKER", "k:9092") // brokers, misspelt
	t.Setenv("SPILLWAY_BUDGET_VERTICE", "5")
	t.Setenv("SPILLWAY_NOT_A_FIELD_AT_ALL", "x")
	_, err := LoadConfig("")
	if err == nil {
		t.Fatal("unknown variables accepted")
	}
	for _, want := range []string{"SPILLWAY_KAFKA_BROKER (", "SPILLWAY_BUDGET_VERTICE (", "unknown environment variable",
		"did you mean SPILLWAY_KAFKA_BROKERS?", "did you mean SPILLWAY_BUDGET_VERTICES?", "SPILLWAY_NOT_A_FIELD_AT_ALL (env SPILLWAY_NOT_A_FIELD_AT_ALL): unknown environment variable: no configuration field reads it (docs/router.md lists them)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	var ce *spillway.FieldError
	if !errors.As(err, &ce) || ce.Source != "env SPILLWAY_BUDGET_VERTICE" {
		t.Errorf("first error %+v, want the variables in order, as FieldErrors", ce)
	}

	// Empty counts as unset; reserved names are not fields.
	clearEnv(t)
	t.Setenv("SPILLWAY_KAFKA_BROKER", "")
	for _, name := range []string{"SPILLWAY_REQUIRE_REDIS", "SPILLWAY_REQUIRE_KAFKA", "SPILLWAY_REQUIRE_CHROMIUM",
		"SPILLWAY_CONFIG", "SPILLWAY_TESTDATA", "SPILLWAY_REBALANCE_OBSERVE", "SPILLWAY_REDIS_DEBUG"} {
		t.Setenv(name, "1")
	}
	if _, err := LoadConfig(""); err != nil {
		t.Errorf("reserved variables rejected: %v", err)
	}
	// Variables without the prefix are none of LoadConfig's business.
	t.Setenv("KAFKA_BROKERS", "x")
	t.Setenv("spillway_broker", "x")
	if _, err := LoadConfig(""); err != nil {
		t.Errorf("unprefixed variables rejected: %v", err)
	}
}

func TestLoadConfigSources(t *testing.T) {
	clearEnv(t)
	path := writeConfig(t, "broker: kafka\nkafka:\n  brokers: [a:9092]\n  rebalance_timeout: 45s\n  sasl:\n    mechanism: PLAIN\n    password: hunter2\n    user: u\n")
	t.Setenv("SPILLWAY_KAFKA_REBALANCE_TIMEOUT", "50s")
	t.Setenv("SPILLWAY_BUDGET_VERTICES", "1000")
	c, src, err := LoadConfigSources(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Kafka.RebalanceTimeout != 50*time.Second || c.Budget.Vertices != 1000 {
		t.Errorf("values: %v %v", c.Kafka.RebalanceTimeout, c.Budget.Vertices)
	}
	for field, want := range map[string]string{
		"broker":                   path + ":1",
		"kafka.brokers":            path + ":3",
		"kafka.rebalance_timeout":  "env SPILLWAY_KAFKA_REBALANCE_TIMEOUT",
		"kafka.sasl.password":      path + ":7",
		"budget.vertices":          "env SPILLWAY_BUDGET_VERTICES",
		"kafka.session_timeout":    sourceDefault,
		"shedding.priority.window": sourceDefault,
		"retry.max_attempts":       sourceDefault,
	} {
		if src[field] != want {
			t.Errorf("source of %s = %q, want %q", field, src[field], want)
		}
	}
	// Zero selects the default, so a written zero that became the default
	// shows the default; a written zero that stays is the file's.
	path = writeConfig(t, "close_timeout: 0s\nretry:\n  disabled: false\n  max_attempts: 0\n")
	t.Setenv("SPILLWAY_BUDGET_VERTICES", "0")
	if c, src, err = LoadConfigSources(path); err != nil {
		t.Fatal(err)
	}
	if c.CloseTimeout != defaultCloseTimeout || src["close_timeout"] != sourceDefault || src["retry.max_attempts"] != sourceDefault ||
		src["budget.vertices"] != sourceDefault || src["retry.disabled"] != path+":3" {
		t.Errorf("sources of zeros: close_timeout %q, retry.max_attempts %q, budget.vertices %q, retry.disabled %q",
			src["close_timeout"], src["retry.max_attempts"], src["budget.vertices"], src["retry.disabled"])
	}
	for _, l := range leaves() {
		if src[l.path] == "" {
			t.Errorf("no source for %s", l.path)
		}
	}
	if len(src) != len(leaves()) {
		t.Errorf("%d sources for %d fields", len(src), len(leaves()))
	}

	// On a validation error the sources come back to say where the bad
	// value was set.
	t.Setenv("SPILLWAY_KAFKA_REBALANCE_TIMEOUT", "-5s")
	path = writeConfig(t, "broker: kafka\nkafka:\n  brokers: [a:9092]\n  session_timeout: -1s\n")
	_, src, err = LoadConfigSources(path)
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ce *spillway.FieldError
		if errors.As(e, &ce) {
			fields = append(fields, ce.Field+" "+src[ce.Field])
		}
	}
	if got := strings.Join(fields, ", "); got != "kafka.rebalance_timeout env SPILLWAY_KAFKA_REBALANCE_TIMEOUT, kafka.session_timeout "+path+":4" {
		t.Errorf("validation errors and their sources: %s (%v)", got, err)
	}
	// Nothing when the file cannot be read.
	if _, src, err = LoadConfigSources(path + ".missing"); err == nil || src != nil {
		t.Errorf("missing file: %v, %v", err, src)
	}
}

// An unknown YAML key is named with its file:line and, like an unknown
// environment variable, the closest known key of its section; with none
// close, the section's keys. A document that is not a mapping says what it
// got.
func TestLoadConfigTypos(t *testing.T) {
	clearEnv(t)
	for _, tt := range []struct {
		name, yaml, field, value, line string
		reason                         []string
	}{
		{"top-level typo", "broker: memory\nretyr:\n  enabled: true\n", "retyr", "retyr", ":2", []string{"did you mean retry?"}},
		{"section typo", "budget: {vertics: 1}\n", "budget.vertics", "vertics", ":1", []string{"did you mean vertices?"}},
		{"inline section typo", "retry:\n  max_atempts: 3\n", "retry.max_atempts", "max_atempts", ":2", []string{"did you mean max_attempts?"}},
		{"lane typo", "budget:\n  lanes:\n    - {name: a, wieght: 2}\n", "budget.lanes[0].wieght", "wieght", ":3", []string{"did you mean weight?"}},
		{"nothing close", "foo: 1\n", "foo", "foo", ":1", []string{"unknown field", "keys at the top level: broker, budget, close_timeout,"}},
		{"nothing close in a section", "telemetry:\n  sampler: x\n", "telemetry.sampler", "sampler", ":2", []string{"keys in telemetry: disabled, lag_interval,"}},
		{"a list", "- a list\n", "(document)", "<sequence>", ":1", []string{"must be a mapping of settings"}},
		{"a scalar", "hello\n", "(document)", "hello", ":1", []string{"must be a mapping of settings"}},
		{"a section's scalar", "budget: 5\n", "budget", "5", ":1", []string{"must be a mapping"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.yaml)
			_, err := LoadConfig(path)
			var fe *spillway.FieldError
			if !errors.As(err, &fe) || len(unwrapAll(err)) != 1 {
				t.Fatalf("LoadConfig = %v, want one FieldError", err)
			}
			if fe.Field != tt.field || fe.Value != tt.value || fe.Source != path+tt.line {
				t.Errorf("field %q value %q source %q, want %q %q %q", fe.Field, fe.Value, fe.Source, tt.field, tt.value, path+tt.line)
			}
			for _, w := range tt.reason {
				if !strings.Contains(fe.Reason, w) {
					t.Errorf("reason %q lacks %q", fe.Reason, w)
				}
			}
		})
	}
}

// Each key of a lane has its own source: the line it is written on, or
// the default.
func TestLoadConfigSourcesOfLaneKeys(t *testing.T) {
	clearEnv(t)
	p := writeConfig(t, "budget:\n  lanes:\n    - {name: fast, handlers: [positions]}\n    - name: rest\n      weight: 3\n")
	_, src, err := LoadConfigSources(p)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"budget.lanes":             p + ":3",
		"budget.lanes[0].name":     p + ":3",
		"budget.lanes[0].handlers": p + ":3",
		"budget.lanes[0].weight":   sourceDefault,
		"budget.lanes[1].name":     p + ":4",
		"budget.lanes[1].weight":   p + ":5",
		"budget.lanes[1].topics":   sourceDefault,
	} {
		if src[key] != want {
			t.Errorf("source of %s = %q, want %q", key, src[key], want)
		}
	}
}

// TestRemovedRetryEnabled: retry.enabled, gone since the gate is on by
// default, says so and names its replacement, in the file and in the
// environment.
func TestRemovedRetryEnabled(t *testing.T) {
	clearEnv(t)
	path := writeConfig(t, "retry:\n  enabled: true\n")
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "retry.disabled: true turns it off") {
		t.Errorf("retry.enabled in the file: %v", err)
	}
	t.Setenv("SPILLWAY_RETRY_ENABLED", "false")
	if _, err := LoadConfig(""); err == nil || !strings.Contains(err.Error(), "SPILLWAY_RETRY_DISABLED=true turns it off") {
		t.Errorf("SPILLWAY_RETRY_ENABLED: %v", err)
	}
}
