package retrygate

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway"
)

func TestZeroConfigTakesDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	want := Config{
		MaxAttempts:     defaultMaxAttempts,
		InitialInterval: defaultInitialInterval,
		MaxInterval:     defaultMaxInterval,
		Multiplier:      defaultMultiplier,
		Jitter:          defaultJitter,
		MaxElapsedTime:  defaultMaxElapsedTime,
		RetryRate:       defaultRetryRate,
		RetryBurst:      defaultRetryBurst,
		RetryRatio:      defaultRetryRatio,
		Defer:           DeferRepublish,
		RetryTopic:      "{topic}.retry",
		DeadLetterTopic: "{topic}.dead_letter",
	}
	if c != want {
		t.Fatalf("defaults = %+v\nwant       %+v", c, want)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config invalid: %v", err)
	}
	if got := c.RetryTopicFor("orders"); got != "orders.retry" {
		t.Errorf("RetryTopicFor = %q", got)
	}
	if got := (Config{}).DeadLetterTopicFor("orders"); got != "orders.dead_letter" {
		t.Errorf("DeadLetterTopicFor = %q", got)
	}
	if got := (Config{RetryTopic: "all-retries"}).RetryTopicFor("orders"); got != "all-retries" {
		t.Errorf("fixed RetryTopicFor = %q", got)
	}
}

func TestValidateNamesFieldAndValue(t *testing.T) {
	cases := []struct {
		cfg   Config
		field string
		value string
	}{
		{Config{MaxAttempts: -1}, "max_attempts", "-1"},
		{Config{InitialInterval: -time.Second}, "initial_interval", "-1s"},
		{Config{MaxInterval: -time.Second}, "max_interval", "-1s"},
		{Config{InitialInterval: time.Minute, MaxInterval: time.Second}, "max_interval", "1s"},
		{Config{Multiplier: 0.5}, "multiplier", "0.5"},
		{Config{Multiplier: math.Inf(1)}, "multiplier", "+Inf"},
		{Config{Jitter: 1.5}, "jitter", "1.5"},
		{Config{Jitter: -0.5}, "jitter", "-0.5"},
		{Config{Jitter: math.NaN()}, "jitter", "NaN"},
		{Config{MaxElapsedTime: -time.Second}, "max_elapsed_time", "-1s"},
		{Config{RetryRate: -2}, "retry_rate", "-2"},
		{Config{RetryBurst: -1}, "retry_burst", "-1"},
		{Config{RetryRatio: -0.1}, "retry_ratio", "-0.1"},
		{Config{RetryRatio: math.Inf(1)}, "retry_ratio", "+Inf"},
		{Config{SaturatedAfter: -time.Second}, "saturated_after", "-1s"},
		{Config{Defer: "drop"}, "defer", "drop"},
		{Config{RetryTopic: "  "}, "retry_topic", "  "},
		{Config{DeadLetterTopic: " "}, "dead_letter_topic", " "},
		{Config{RetryTopic: "x", DeadLetterTopic: "x"}, "dead_letter_topic", "x"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		var ce *spillway.FieldError
		if !errors.As(err, &ce) {
			t.Errorf("%+v: err = %v, want a *spillway.FieldError", c.cfg, err)
			continue
		}
		if ce.Field != c.field || ce.Value != c.value {
			t.Errorf("%+v: error names %s=%q, want %s=%q", c.cfg, ce.Field, ce.Value, c.field, c.value)
		}
		if !strings.Contains(err.Error(), c.field) || !strings.Contains(err.Error(), `"`+c.value+`"`) {
			t.Errorf("message %q does not name field and value", err)
		}
		if _, err := New(newRecPub(nil), c.cfg); err == nil {
			t.Errorf("%+v: New accepted an invalid config", c.cfg)
		}
	}
	// Every problem is reported, not just the first.
	err := Config{MaxAttempts: -1, RetryBurst: -1}.Validate()
	if n := strings.Count(err.Error(), "config: "); n != 2 {
		t.Fatalf("got %d errors in %q, want 2", n, err)
	}
	// Off and unlimited are accepted.
	ok := Config{Jitter: spillway.Off, RetryRate: math.Inf(1), RetryRatio: spillway.Off}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Config{RetryRate: spillway.Off}).Validate(); err != nil {
		t.Fatal(err)
	}
	var fe *spillway.FieldError
	if _, err := New(nil, Config{}); !errors.As(err, &fe) || fe.Field != "pub" || !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Fatalf("err = %v, want a FieldError for Publisher", err)
	}
}

// The config decodes from YAML under its tags and every leaf has an env
// tag, so a larger configuration can embed it.
func TestConfigYAML(t *testing.T) {
	src := `
max_attempts: 7
initial_interval: 250ms
max_interval: 30s
multiplier: 1.5
jitter: -1
max_elapsed_time: 20s
retry_rate: .inf
retry_burst: 50
retry_ratio: 0.1
saturated_after: 2s
defer: nack
retry_topic: "{topic}-retry"
dead_letter_topic: dead
`
	var c Config
	dec := yaml.NewDecoder(strings.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	want := Config{
		MaxAttempts: 7, InitialInterval: 250 * time.Millisecond, MaxInterval: 30 * time.Second,
		Multiplier: 1.5, Jitter: spillway.Off, MaxElapsedTime: 20 * time.Second, RetryRate: math.Inf(1),
		RetryBurst: 50, RetryRatio: 0.1, SaturatedAfter: 2 * time.Second, Defer: DeferNack,
		RetryTopic: "{topic}-retry", DeadLetterTopic: "dead",
	}
	if c != want {
		t.Fatalf("decoded %+v\nwant    %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeOf(Config{})
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Tag.Get("yaml") == "" || f.Tag.Get("env") == "" {
			t.Errorf("field %s lacks a yaml or env tag", f.Name)
		}
	}
}
