package shedding

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-go/spillway"
)

// Config defaults. docs/shedding.md lists them too.
const (
	defaultWindow      = 30 * time.Second
	defaultPriorityKey = "region_priority"
	defaultShedBelow   = 2
	defaultEntityKey   = "entity_id"
	defaultVersionKey  = "entity_version"
	defaultMaxEntities = 100_000
)

// Config is a shedding policy. It is meant to be embedded in a larger YAML
// configuration (the router's, under a key such as "shedding"); every field
// has a yaml tag, and an env tag in the style of the router's configuration
// (nested sections carry an envPrefix tag).
//
// The zero value is valid and inert: with no Topics nothing is ever shed,
// superseded or guarded. A zero field takes the default documented on it,
// so a zero numeric field means "the default", never zero.
type Config struct {
	// Topics is the explicit allow-list of sheddable topics: streams in
	// which every message is superseded by a later one for the same entity
	// (vehicle positions, sensor telemetry). Messages of any other topic
	// are never shed, guarded or coalesced, whatever their metadata says.
	// Default: none.
	Topics []string `yaml:"topics" env:"TOPICS"`

	// AuditTopic, if set, receives a copy of every message the policy
	// drops (same UUID, payload and metadata, plus the spillway_shed_*
	// metadata), so that drops are visible and can be replayed. It needs a
	// publisher ([WithAuditPublisher]) and must not be a sheddable topic.
	// Default: no audit.
	AuditTopic string `yaml:"audit_topic" env:"AUDIT_TOPIC"`

	// EntityKey is the metadata key naming the entity a message updates
	// (a vehicle, a sensor). The version guard and coalescing key on it.
	// Default entity_id, the key the router partitions Kafka topics by.
	EntityKey string `yaml:"entity_key" env:"ENTITY_KEY"`

	// VersionKey is the metadata key of the entity's version: an unsigned
	// base-10 integer that grows with every update (a sequence number or a
	// Unix timestamp in a fixed unit). Default entity_version.
	VersionKey string `yaml:"version_key" env:"VERSION_KEY"`

	// Priority configures shedding by region priority under sustained
	// pressure.
	Priority PriorityConfig `yaml:"priority" envPrefix:"PRIORITY_"`

	// VersionGuard configures the stale-version guard.
	VersionGuard VersionGuardConfig `yaml:"version_guard" envPrefix:"VERSION_GUARD_"`

	// Coalesce configures keyed coalescing of messages waiting for budget.
	Coalesce CoalesceConfig `yaml:"coalesce" envPrefix:"COALESCE_"`
}

// PriorityConfig configures shedding by priority. Once the pressure signal
// has reported pressure for Window without a break, a message of a
// sheddable topic whose priority is below ShedBelow is acked without being
// handled. Shedding stops as soon as the pressure clears.
type PriorityConfig struct {
	// Disabled turns priority shedding off; the version guard and
	// coalescing still apply if enabled. Default false: sheddable topics
	// are shed by priority.
	Disabled bool `yaml:"disabled" env:"DISABLED"`

	// Window is how long pressure must last, unbroken, before shedding
	// starts. Default 30s.
	Window time.Duration `yaml:"window" env:"WINDOW"`

	// Key is the metadata key of the region priority, a base-10 integer
	// (an optional sign, then digits). Default region_priority.
	Key string `yaml:"key" env:"KEY"`

	// ShedBelow is the threshold: a message whose priority is strictly
	// below it is shed under sustained pressure. Default 2 (priorities 0
	// and 1 are shed, 2 and above are kept). Because zero means the
	// default, a threshold of 0 cannot be expressed; use Disabled to never
	// shed by priority.
	ShedBelow int64 `yaml:"shed_below" env:"SHED_BELOW"`

	// Missing is the priority assumed for a message whose priority is
	// missing or malformed (not a base-10 integer). Default 0: such a
	// message is sheddable, so a producer that forgets the key cannot
	// protect its traffic by accident. Set it to ShedBelow or more to keep
	// such messages instead. Malformed values are counted either way.
	Missing int64 `yaml:"missing" env:"MISSING"`
}

// VersionGuardConfig configures the stale-version guard: a message of a
// sheddable topic whose version is not newer than the last version handled
// successfully (and acked) for its entity is acked without being handled.
type VersionGuardConfig struct {
	// Enabled turns the guard on. Default false.
	Enabled bool `yaml:"enabled" env:"ENABLED"`

	// MaxEntities bounds the guard's memory: it remembers the last
	// version of at most this many entities (per topic) and forgets the
	// least recently seen one first. A forgotten entity's next message is
	// handled, whatever its version. An entity costs about 220 bytes with
	// a short id (about 22 MB at the default). Default 100000.
	MaxEntities int `yaml:"max_entities" env:"MAX_ENTITIES"`
}

// CoalesceConfig configures keyed coalescing: while several messages of one
// entity wait for budget, only the newest proceeds and the older ones are
// acked as superseded. It needs the policy's admission hooks wired around
// the budget (see [Policy.Admitted] and [Policy.Revoked]).
type CoalesceConfig struct {
	// Enabled turns coalescing on. Default false.
	Enabled bool `yaml:"enabled" env:"ENABLED"`
}

func (c *Config) setDefaults() {
	if c.EntityKey == "" {
		c.EntityKey = defaultEntityKey
	}
	if c.VersionKey == "" {
		c.VersionKey = defaultVersionKey
	}
	p := &c.Priority
	if p.Window == 0 {
		p.Window = defaultWindow
	}
	if p.Key == "" {
		p.Key = defaultPriorityKey
	}
	if p.ShedBelow == 0 {
		p.ShedBelow = defaultShedBelow
	}
	if c.VersionGuard.MaxEntities == 0 {
		c.VersionGuard.MaxEntities = defaultMaxEntities
	}
}

// WithDefaults returns c with every zero field set to its default, as
// [New] uses it. The router reads it to check its other sections against
// the effective values (retry.saturated_after against priority.window)
// and to show them.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	c.Topics = append([]string(nil), c.Topics...)
	return c
}

// Validate reports every invalid field of c, after defaults are applied (so
// zero fields are fine). The error joins one [*spillway.FieldError] per problem.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &spillway.FieldError{Field: field, Value: value, Reason: reason})
	}
	seen := make(map[string]int, len(c.Topics))
	for i, t := range c.Topics {
		field := fmt.Sprintf("topics[%d]", i)
		switch j, dup := seen[t]; {
		case strings.TrimSpace(t) == "":
			bad(field, t, "must not be blank")
		case dup:
			bad(field, t, fmt.Sprintf("duplicates topics[%d]", j))
		default:
			seen[t] = i
		}
	}
	if c.AuditTopic != "" {
		if strings.TrimSpace(c.AuditTopic) == "" {
			bad("audit_topic", c.AuditTopic, "must not be blank")
		} else if j, ok := seen[c.AuditTopic]; ok {
			bad("audit_topic", c.AuditTopic, fmt.Sprintf("must not be a sheddable topic (it is topics[%d])", j))
		}
	}
	if strings.TrimSpace(c.EntityKey) == "" {
		bad("entity_key", c.EntityKey, "must not be blank")
	}
	if strings.TrimSpace(c.VersionKey) == "" {
		bad("version_key", c.VersionKey, "must not be blank")
	} else if c.VersionKey == c.EntityKey {
		bad("version_key", c.VersionKey, "must differ from entity_key")
	}
	p := c.Priority
	if p.Window < 0 {
		bad("priority.window", p.Window.String(), "must be positive")
	}
	if strings.TrimSpace(p.Key) == "" {
		bad("priority.key", p.Key, "must not be blank")
	}
	if c.VersionGuard.MaxEntities < 0 {
		bad("version_guard.max_entities", strconv.Itoa(c.VersionGuard.MaxEntities), "must be positive")
	}
	if len(c.Topics) == 0 {
		if c.VersionGuard.Enabled {
			bad("version_guard.enabled", "true", "has no effect without sheddable topics")
		}
		if c.Coalesce.Enabled {
			bad("coalesce.enabled", "true", "has no effect without sheddable topics")
		}
	}
	return errors.Join(errs...)
}
