package shedding

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway"
)

func TestConfigDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.EntityKey != "entity_id" || c.VersionKey != "entity_version" {
		t.Errorf("keys = %q, %q", c.EntityKey, c.VersionKey)
	}
	p := c.Priority
	if p.Window != 30*time.Second || p.Key != "region_priority" || p.ShedBelow != 2 || p.Missing != 0 || p.Disabled {
		t.Errorf("priority defaults = %+v", p)
	}
	if c.VersionGuard.MaxEntities != 100_000 || c.VersionGuard.Enabled || c.Coalesce.Enabled {
		t.Errorf("guard/coalesce defaults = %+v %+v", c.VersionGuard, c.Coalesce)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero config invalid: %v", err)
	}
	// Set values are kept.
	c = Config{Priority: PriorityConfig{Window: time.Second, ShedBelow: 5, Missing: 9}}.WithDefaults()
	if c.Priority.Window != time.Second || c.Priority.ShedBelow != 5 || c.Priority.Missing != 9 {
		t.Errorf("explicit values overwritten: %+v", c.Priority)
	}
	// New keeps the configuration with defaults applied.
	pol, err := New(Config{})
	if err != nil || pol.cfg.Priority.Window != 30*time.Second {
		t.Errorf("policy config without defaults: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	c := Config{
		Topics:       []string{"vehicles", " ", "vehicles"},
		AuditTopic:   "vehicles",
		EntityKey:    " ",
		VersionKey:   "k",
		Priority:     PriorityConfig{Window: -time.Second, Key: "\t"},
		VersionGuard: VersionGuardConfig{MaxEntities: -3},
	}
	err := c.Validate()
	want := map[string]string{
		"topics[1]":                  " ",
		"topics[2]":                  "vehicles",
		"audit_topic":                "vehicles",
		"entity_key":                 " ",
		"priority.window":            "-1s",
		"priority.key":               "\t",
		"version_guard.max_entities": "-3",
	}
	got := map[string]string{}
	for _, e := range unjoin(err) {
		var fe *spillway.FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("not a FieldError: %v", e)
		}
		got[fe.Field] = fe.Value
		if !strings.Contains(fe.Error(), fe.Field) {
			t.Errorf("error %q does not name its field", fe.Error())
		}
	}
	for f, v := range want {
		if got[f] != v {
			t.Errorf("field %s: value %q, want %q (all: %v)", f, got[f], v, err)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d errors, want %d: %v", len(got), len(want), err)
	}

	err = Config{EntityKey: "id", VersionKey: "id"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "version_key") {
		t.Errorf("same entity and version key accepted: %v", err)
	}
	err = Config{VersionGuard: VersionGuardConfig{Enabled: true}, Coalesce: CoalesceConfig{Enabled: true}}.Validate()
	if n := len(unjoin(err)); n != 2 {
		t.Errorf("guard and coalescing without topics: %d errors, want 2: %v", n, err)
	}
	want1 := `config: priority.window: must be positive, got "-1s"`
	if err := (Config{Priority: PriorityConfig{Window: -time.Second}}).Validate(); err == nil || err.Error() != want1 {
		t.Errorf("error = %v, want %s", err, want1)
	}
}

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// The lead embeds Config in the router's YAML configuration.
func TestConfigYAML(t *testing.T) {
	var doc struct {
		Shedding Config `yaml:"shedding"`
	}
	src := `
shedding:
  topics: [vehicle.positions, sensor.telemetry]
  audit_topic: spillway.shed
  entity_key: vehicle_id
  version_key: seq
  priority:
    window: 45s
    key: prio
    shed_below: 3
    missing: 1
  version_guard:
    enabled: true
    max_entities: 5000
  coalesce:
    enabled: true
`
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	c := doc.Shedding
	want := Config{
		Topics:       []string{"vehicle.positions", "sensor.telemetry"},
		AuditTopic:   "spillway.shed",
		EntityKey:    "vehicle_id",
		VersionKey:   "seq",
		Priority:     PriorityConfig{Window: 45 * time.Second, Key: "prio", ShedBelow: 3, Missing: 1},
		VersionGuard: VersionGuardConfig{Enabled: true, MaxEntities: 5000},
		Coalesce:     CoalesceConfig{Enabled: true},
	}
	if c.AuditTopic != want.AuditTopic || c.EntityKey != want.EntityKey || c.VersionKey != want.VersionKey ||
		c.Priority != want.Priority || c.VersionGuard != want.VersionGuard || c.Coalesce != want.Coalesce ||
		strings.Join(c.Topics, ",") != strings.Join(want.Topics, ",") {
		t.Fatalf("decoded %+v\nwant    %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var empty struct {
		Shedding Config `yaml:"shedding"`
	}
	if err := yaml.Unmarshal([]byte("shedding: {}\n"), &empty); err != nil {
		t.Fatal(err)
	}
	if err := empty.Shedding.Validate(); err != nil {
		t.Fatal(err)
	}
}
