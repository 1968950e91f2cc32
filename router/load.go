package router

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway"
)

// LoadConfig reads the YAML file at path (skipped when path is ""), then
// applies SPILLWAY_* environment variables on top (the environment wins),
// fills defaults and validates. Unknown YAML keys are errors, naming the
// closest known key of their section (or, with none close, the section's
// keys), and so is a set, non-empty SPILLWAY_* variable that no field
// reads (a typo would otherwise be ignored), except the reserved names listed in
// docs/router.md: SPILLWAY_CONFIG, SPILLWAY_TESTDATA,
// SPILLWAY_REBALANCE_OBSERVE, SPILLWAY_REDIS_DEBUG and anything starting
// with SPILLWAY_REQUIRE_. YAML anchors, aliases and merge keys (<<: *base)
// work. Every error names the field (as its YAML path), where the value
// came from and the value itself, secrets excepted.
func LoadConfig(path string) (Config, error) {
	c, _, err := LoadConfigSources(path)
	return c, err
}

// LoadConfigSources is [LoadConfig] that also says where each value came
// from. The map has one entry per leaf field, keyed by its YAML path (e.g.
// kafka.brokers), and, for a list of sections, one per key of each item
// (budget.lanes[0].weight), whose value is "FILE:LINE" (the line of the value in the
// file, path as given), "env NAME" (the environment variable), or
// "default" for a field that holds its default (set neither in the file
// nor in the environment, or set to zero there, which selects the
// default). These are the strings [spillway.FieldError.Source] uses. When
// only validation fails the map comes back with the error, so that a
// caller can say where each bad value was set (Validate does not know);
// when the file or the environment cannot be read it is nil.
func LoadConfigSources(path string) (Config, map[string]string, error) {
	var c Config
	src := make(map[string]string)
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return Config{}, nil, fmt.Errorf("router: config: %w", err)
		}
		if err := decodeYAML(data, path, &c, src); err != nil {
			return Config{}, nil, err
		}
	}
	if err := applyEnv(&c, nil, src); err != nil {
		return Config{}, nil, err
	}
	loaded := reflect.ValueOf(c)
	c.setDefaults()
	// A field that was not set, or was set to zero and then given its
	// default, shows the default.
	for _, l := range leaves() {
		v := reflect.ValueOf(c).FieldByIndex(l.index)
		if _, ok := src[l.path]; !ok || !reflect.DeepEqual(loaded.FieldByIndex(l.index).Interface(), v.Interface()) {
			src[l.path] = sourceDefault
		}
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Struct {
			// A list of sections: each item's keys not written in the
			// file hold their defaults (a lane's weight 1).
			keys := make(map[string]bool)
			keysOf(v.Type().Elem(), keys)
			for i := range v.Len() {
				for k := range keys {
					if p := l.path + "[" + strconv.Itoa(i) + "]." + k; src[p] == "" {
						src[p] = sourceDefault
					}
				}
			}
		}
	}
	// A broker's consumer group left unset takes the top-level one, and
	// its source.
	for _, k := range []string{"kafka.consumer_group", "redis.consumer_group"} {
		if src[k] == sourceDefault {
			src[k] = src["consumer_group"]
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, src, err
	}
	return c, src, nil
}

// sourceDefault is the source LoadConfigSources gives a field that holds
// its default.
const sourceDefault = "default"

// notConfig reports whether name, a variable starting with envVarPrefix, is
// one that Spillway's programs and tests read themselves rather than a
// configuration field, so LoadConfig must not reject it.
func notConfig(name string) bool {
	switch name {
	case envVarPrefix + "CONFIG", // the examples' configuration file
		envVarPrefix + "TESTDATA",          // internal/geodata: the sample data directory
		envVarPrefix + "REBALANCE_OBSERVE", // router's rebalance test
		envVarPrefix + "REDIS_DEBUG",       // redisbroker's tests
		envVarPrefix + "SOAK":              // internal/crashtest's soak (make soak)
		return true
	}
	return strings.HasPrefix(name, envVarPrefix+"REQUIRE_") // the test harness: SPILLWAY_REQUIRE_REDIS, ...
}

// leaf is one settable configuration value.
type leaf struct {
	path   string // yaml path
	env    string // full environment variable name
	secret bool
	index  []int // field index path from Config
}

// leaves lists every leaf field of Config, depth first, in field order.
// A struct embedded with yaml ",inline" adds its fields to the enclosing
// section (same YAML path, same environment prefix).
func leaves() []leaf {
	var out []leaf
	var walk func(t reflect.Type, path, envPrefix string, index []int)
	walk = func(t reflect.Type, path, envPrefix string, index []int) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			idx := append(append([]int(nil), index...), i)
			if skipped(f) {
				continue
			}
			if inline(f) {
				walk(f.Type, path, envPrefix+f.Tag.Get("envPrefix"), idx)
				continue
			}
			name := yamlName(f)
			p := name
			if path != "" {
				p = path + "." + name
			}
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
				walk(f.Type, p, envPrefix+f.Tag.Get("envPrefix"), idx)
				continue
			}
			out = append(out, leaf{
				path:   p,
				env:    envPrefix + f.Tag.Get("env"),
				secret: isSecret(f.Type),
				index:  idx,
			})
		}
	}
	walk(reflect.TypeOf(Config{}), "", envVarPrefix, nil)
	return out
}

// isSecret reports whether t is the redacted string type, spillway.Secret
// (kafka.sasl.password, kafka.tls.key_pem, redis.password).
func isSecret(t reflect.Type) bool {
	return t == reflect.TypeOf(spillway.Secret(""))
}

func yamlName(f reflect.StructField) string { return strings.Split(f.Tag.Get("yaml"), ",")[0] }

// skipped reports whether f is no setting: unexported, or tagged yaml:"-"
// (code, which the router sets itself).
func skipped(f reflect.StructField) bool { return !f.IsExported() || yamlName(f) == "-" }

// inline reports whether f is an embedded struct whose fields YAML reads as
// the enclosing mapping's (yaml:",inline").
func inline(f reflect.StructField) bool {
	if !f.Anonymous || f.Type.Kind() != reflect.Struct {
		return false
	}
	_, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return slices.Contains(strings.Split(opts, ","), "inline")
}

// fieldByKey finds the field of struct type t whose YAML key is key,
// looking into inline structs.
func fieldByKey(t reflect.Type, key string) ([]int, bool) {
	for j := 0; j < t.NumField(); j++ {
		f := t.Field(j)
		if skipped(f) {
			continue
		}
		if inline(f) {
			if idx, ok := fieldByKey(f.Type, key); ok {
				return append([]int{j}, idx...), true
			}
			continue
		}
		if yamlName(f) == key {
			return []int{j}, true
		}
	}
	return nil, false
}

func (l leaf) show(v string) string {
	if l.secret && v != "" {
		return redacted
	}
	return v
}

// applyEnv overlays environment variables on c and records in src the
// fields they set. environ, if non-nil, replaces the process environment
// (tests). A non-empty SPILLWAY_* variable that names no field is an error
// (see [notConfig]); an empty one counts as unset, as for the fields.
func applyEnv(c *Config, environ map[string]string, src map[string]string) error {
	if environ == nil {
		environ = env.ToMap(os.Environ())
	}
	known := make(map[string]bool)
	for _, l := range leaves() {
		known[l.env] = true
	}
	var unknown []string
	for name, v := range environ {
		if strings.HasPrefix(name, envVarPrefix) && v != "" && !known[name] && !notConfig(name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		errs := make([]error, 0, len(unknown))
		for _, name := range unknown {
			reason := "unknown environment variable: no configuration field reads it"
			if r, ok := removedKeys[name]; ok {
				reason += "; " + r
			} else if near := nearest(name, known); near != "" {
				reason += "; did you mean " + near + "?"
			} else {
				reason += " (docs/router.md lists them)"
			}
			errs = append(errs, &spillway.FieldError{Field: name, Value: name, Source: "env " + name, Reason: reason})
		}
		return errors.Join(errs...)
	}
	opts := env.Options{Prefix: envVarPrefix, Environment: environ}
	if err := env.ParseWithOptions(c, opts); err == nil {
		for _, l := range leaves() {
			if environ[l.env] != "" {
				src[l.path] = "env " + l.env
			}
		}
		return nil
	}
	// env reports Go field names, which repeat across sections. Attribute
	// each failure by parsing the variables that are set one at a time.
	var errs []error
	for _, l := range leaves() {
		v, ok := environ[l.env]
		if !ok {
			continue
		}
		var probe Config
		err := env.ParseWithOptions(&probe, env.Options{Prefix: envVarPrefix, Environment: map[string]string{l.env: v}})
		if err == nil {
			continue
		}
		reason := "cannot parse"
		var pe env.ParseError
		if errors.As(err, &pe) && !l.secret {
			reason = "cannot parse: " + pe.Err.Error()
		}
		errs = append(errs, &spillway.FieldError{Field: l.path, Value: l.show(v), Reason: reason, Source: "env " + l.env})
	}
	if len(errs) == 0 {
		return fmt.Errorf("router: config: environment: %w", env.ParseWithOptions(c, opts))
	}
	return errors.Join(errs...)
}

// nearest returns the name in known closest to name, if it is at most two
// edits away, or "".
func nearest(name string, known map[string]bool) string {
	best, bestD := "", 3
	for k := range known {
		if d := editDistance(name, k); d < bestD || d == bestD && k < best {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// decodeYAML decodes data into c field by field so that every error names
// the field's path and line, and records in src the line of every leaf it
// sets.
func decodeYAML(data []byte, file string, c *Config, src map[string]string) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("router: config: %s: %w", file, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	d := decoder{file: file, src: src}
	d.node(doc.Content[0], reflect.ValueOf(c).Elem(), "")
	return errors.Join(d.errs...)
}

type decoder struct {
	file string
	src  map[string]string
	errs []error
}

func (d *decoder) at(n *yaml.Node) string { return fmt.Sprintf("%s:%d", d.file, n.Line) }

func (d *decoder) node(n *yaml.Node, v reflect.Value, path string) {
	if r := resolve(n); v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Struct && r.Kind == yaml.SequenceNode {
		// A list of sections (budget.lanes): each item is decoded like a
		// section, so an unknown key is an error naming it, but the list
		// is one leaf.
		items := reflect.MakeSlice(v.Type(), len(r.Content), len(r.Content))
		for i, item := range r.Content {
			d.node(item, items.Index(i), path+"["+strconv.Itoa(i)+"]")
		}
		v.Set(items)
		d.src[path] = d.at(n)
		return
	}
	if v.Kind() != reflect.Struct || v.Type() == reflect.TypeOf(time.Duration(0)) {
		// A fresh value, so that a list or map replaces rather than
		// extends what an earlier key of the same name decoded.
		fresh := reflect.New(v.Type())
		if err := n.Decode(fresh.Interface()); err != nil {
			r := resolve(n)
			value := r.Value
			if r.Kind != yaml.ScalarNode {
				value = "<" + kindName(r.Kind) + ">"
			}
			if isSecret(v.Type()) && value != "" {
				value = redacted
			}
			d.errs = append(d.errs, &spillway.FieldError{Field: path, Value: value, Reason: "cannot be read as " + typeName(v.Type()), Source: d.at(n)})
			return
		}
		v.Set(fresh.Elem())
		d.src[path] = d.at(n)
		return
	}
	r := resolve(n)
	if r.Kind == yaml.ScalarNode && r.Tag == "!!null" {
		return // an empty section
	}
	if r.Kind != yaml.MappingNode {
		name, reason := path, "must be a mapping of keys to values"
		if name == "" {
			name = "(document)"
			reason = "the file must be a mapping of settings, such as broker: kafka (docs/router.md lists them)"
		}
		value := "<" + kindName(r.Kind) + ">"
		if r.Kind == yaml.ScalarNode {
			value = r.Value
		}
		d.errs = append(d.errs, &spillway.FieldError{Field: name, Value: value, Reason: reason, Source: d.at(n)})
		return
	}
	t := v.Type()
	for _, kv := range d.pairs(r, path) {
		key, val := kv[0], kv[1]
		p := key.Value
		if path != "" {
			p = path + "." + key.Value
		}
		field, ok := fieldByKey(t, key.Value)
		if !ok {
			d.errs = append(d.errs, &spillway.FieldError{Field: p, Value: key.Value, Reason: unknownKey(t, key.Value, path), Source: d.at(key)})
			continue
		}
		d.node(val, v.FieldByIndex(field), p)
	}
}

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isMerge(key *yaml.Node) bool {
	return key.Kind == yaml.ScalarNode && key.ShortTag() == "!!merge"
}

// pairs lists the key/value pairs of mapping m with its merge keys
// (<<: *base, or <<: [*a, *b]) expanded as YAML defines them: a key
// written in m wins over a merged one, and of the merged mappings the
// first listed wins. Each key appears once: m's own keys first, in their
// order, then the merged ones.
func (d *decoder) pairs(m *yaml.Node, path string) [][2]*yaml.Node {
	var out [][2]*yaml.Node
	index := make(map[string]int)
	put := func(k, v *yaml.Node, override bool) {
		if i, ok := index[k.Value]; ok {
			if override {
				out[i] = [2]*yaml.Node{k, v}
			}
			return
		}
		index[k.Value] = len(out)
		out = append(out, [2]*yaml.Node{k, v})
	}
	var merged [][2]*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		key, val := m.Content[i], m.Content[i+1]
		if !isMerge(key) {
			put(key, val, true)
			continue
		}
		var sources []*yaml.Node
		switch r := resolve(val); r.Kind {
		case yaml.MappingNode:
			sources = []*yaml.Node{r}
		case yaml.SequenceNode:
			for _, s := range r.Content {
				sources = append(sources, resolve(s))
			}
		}
		for _, s := range sources {
			if s.Kind != yaml.MappingNode {
				name := path
				if name == "" {
					name = "(document)"
				}
				d.errs = append(d.errs, &spillway.FieldError{Field: name + ".<<", Value: "<" + kindName(s.Kind) + ">",
					Reason: "a merge key takes a mapping or a list of mappings", Source: d.at(val)})
				continue
			}
			merged = append(merged, d.pairs(s, path)...)
		}
	}
	for _, kv := range merged {
		put(kv[0], kv[1], false)
	}
	return out
}

// removedKeys says what became of configuration keys that are gone, by
// YAML path and by environment variable.
var removedKeys = map[string]string{
	"retry.enabled":                "the retry gate is on by default; retry.disabled: true turns it off",
	envVarPrefix + "RETRY_ENABLED": "the retry gate is on by default; SPILLWAY_RETRY_DISABLED=true turns it off",
}

// unknownKey is the reason for an unknown key in a section of struct
// type t at path: the closest known key, if one is at most two edits
// away, or else every key the section has.
func unknownKey(t reflect.Type, key, path string) string {
	full := key
	if path != "" {
		full = path + "." + key
	}
	if r, ok := removedKeys[full]; ok {
		return "unknown field (" + r + ")"
	}
	known := make(map[string]bool)
	keysOf(t, known)
	if near := nearest(key, known); near != "" {
		return "unknown field (did you mean " + near + "?)"
	}
	where := "at the top level"
	if path != "" {
		where = "in " + path
	}
	return "unknown field (the keys " + where + ": " + sortedNames(known) + ")"
}

// keysOf adds the YAML keys of struct type t to keys, those of inline
// structs included.
func keysOf(t reflect.Type, keys map[string]bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		switch {
		case skipped(f):
		case inline(f):
			keysOf(f.Type, keys)
		default:
			keys[yamlName(f)] = true
		}
	}
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "sequence"
	case yaml.AliasNode:
		return "alias"
	default:
		return "scalar"
	}
}

func typeName(t reflect.Type) string {
	switch t {
	case reflect.TypeOf(time.Duration(0)):
		return "a duration such as 30s"
	}
	switch t.Kind() {
	case reflect.Slice:
		return "a list of " + strings.TrimPrefix(typeName(t.Elem()), "a ") + "s"
	case reflect.Map:
		return "a mapping of names to " + strings.TrimPrefix(typeName(t.Elem()), "a ") + "s"
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	case reflect.Float32, reflect.Float64:
		return "a number such as 0.5 (.inf for infinity)"
	default:
		return "an integer (" + t.Kind().String() + ")"
	}
}
