package router

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway/kafkabroker"
)

// LoadConfig reads the YAML file at path (skipped when path is ""), then
// applies SPILLWAY_* environment variables on top (the environment wins),
// fills defaults and validates. Unknown YAML keys are errors. Every error
// names the field (as its YAML path), where the value came from and the
// value itself, secrets excepted.
func LoadConfig(path string) (Config, error) {
	var c Config
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("router: config: %w", err)
		}
		if err := decodeYAML(data, path, &c); err != nil {
			return Config{}, err
		}
	}
	if err := applyEnv(&c, nil); err != nil {
		return Config{}, err
	}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
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
	walk(reflect.TypeOf(Config{}), "", EnvPrefix, nil)
	return out
}

// isSecret reports whether t is one of the redacted string types: the
// router's Secret or kafkabroker's.
func isSecret(t reflect.Type) bool {
	return t == reflect.TypeOf(Secret("")) || t == reflect.TypeOf(kafkabroker.Secret(""))
}

func yamlName(f reflect.StructField) string { return strings.Split(f.Tag.Get("yaml"), ",")[0] }

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

// applyEnv overlays environment variables on c. environ, if non-nil,
// replaces the process environment (tests).
func applyEnv(c *Config, environ map[string]string) error {
	opts := env.Options{Prefix: EnvPrefix, Environment: environ}
	if err := env.ParseWithOptions(c, opts); err == nil {
		return nil
	}
	// env reports Go field names, which repeat across sections. Attribute
	// each failure by parsing the variables that are set one at a time.
	if environ == nil {
		environ = env.ToMap(os.Environ())
	}
	var errs []error
	for _, l := range leaves() {
		v, ok := environ[l.env]
		if !ok {
			continue
		}
		var probe Config
		err := env.ParseWithOptions(&probe, env.Options{Prefix: EnvPrefix, Environment: map[string]string{l.env: v}})
		if err == nil {
			continue
		}
		reason := "cannot parse"
		var pe env.ParseError
		if errors.As(err, &pe) && !l.secret {
			reason = "cannot parse: " + pe.Err.Error()
		}
		errs = append(errs, &ConfigError{Field: l.path, Value: l.show(v), Reason: reason, Source: "env " + l.env})
	}
	if len(errs) == 0 {
		return fmt.Errorf("router: config: environment: %w", env.ParseWithOptions(c, opts))
	}
	return errors.Join(errs...)
}

// decodeYAML decodes data into c field by field so that every error names
// the field's path and line.
func decodeYAML(data []byte, file string, c *Config) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("router: config: %s: %w", file, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	var errs []error
	decodeNode(doc.Content[0], reflect.ValueOf(c).Elem(), "", file, &errs)
	return errors.Join(errs...)
}

func decodeNode(n *yaml.Node, v reflect.Value, path, file string, errs *[]error) {
	at := func(n *yaml.Node) string { return fmt.Sprintf("%s:%d", file, n.Line) }
	if v.Kind() != reflect.Struct || v.Type() == reflect.TypeOf(time.Duration(0)) {
		if err := n.Decode(v.Addr().Interface()); err != nil {
			value := n.Value
			if n.Kind != yaml.ScalarNode {
				value = "<" + kindName(n.Kind) + ">"
			}
			if isSecret(v.Type()) && value != "" {
				value = redacted
			}
			*errs = append(*errs, &ConfigError{Field: path, Value: value, Reason: "cannot be read as " + typeName(v.Type()), Source: at(n)})
		}
		return
	}
	if n.Kind != yaml.MappingNode {
		name := path
		if name == "" {
			name = "(document)"
		}
		*errs = append(*errs, &ConfigError{Field: name, Value: "<" + kindName(n.Kind) + ">", Reason: "must be a mapping", Source: at(n)})
		return
	}
	t := v.Type()
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		p := key.Value
		if path != "" {
			p = path + "." + key.Value
		}
		field, ok := fieldByKey(t, key.Value)
		if !ok {
			*errs = append(*errs, &ConfigError{Field: p, Value: key.Value, Reason: "unknown field", Source: at(key)})
			continue
		}
		decodeNode(val, v.FieldByIndex(field), p, file, errs)
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
