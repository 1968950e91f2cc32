package main

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/router"
	"github.com/spillway-go/spillway/sizing"
)

func newConfigCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check or print a router configuration",
		Long: `config loads a router configuration the way router.LoadConfig does: the YAML
file, then the SPILLWAY_* environment variables on top (the environment wins),
then the defaults. docs/router.md lists every field.`,
		RunE: parentRunE,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "check FILE",
		Short: "Validate a configuration file and the SPILLWAY_* environment",
		Long: `check loads FILE and the SPILLWAY_* environment and validates the result.
On success it prints "ok", the broker and its redelivery deadline. Otherwise it
prints one line per problem on stderr, "field (source): reason, got value",
and exits with code 2. A source is FILE:LINE or "env NAME".`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error { return runConfigCheck(e, args[0]) },
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "print FILE",
		Short: "Print the effective configuration and where each value came from",
		Long: `print loads FILE and the SPILLWAY_* environment like check and prints the
configuration the router would run with, defaults filled in, as YAML. Secrets
print as '[redacted]'. A default worked out from other settings shows its value:
a lane's weight 1, budget.autosize.deadline the broker's redelivery deadline.
Each value ends with a comment naming its source:
"# from FILE:LINE", "# from env NAME" or "# default". A configuration that does not
validate is reported as by check and nothing is printed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error { return runConfigPrint(e, args[0]) },
	})
	return cmd
}

// loadConfig loads path and turns a failure into an input error that lists
// every problem with its source.
func loadConfig(path string) (router.Config, map[string]string, error) {
	c, src, err := router.LoadConfigSources(path)
	if err != nil {
		return c, nil, inputError{configProblems(err, src)}
	}
	return c, src, nil
}

func runConfigCheck(e *env, path string) error {
	c, _, err := loadConfig(path)
	if err != nil {
		return err
	}
	deadline := "none (memory)"
	if c.Broker == "custom" {
		deadline = "set in code (router.WithBroker)"
	}
	if d := c.RedeliveryDeadline(); d > 0 {
		key := "kafka.rebalance_timeout"
		if c.Broker == "redis" {
			key = "redis.max_idle_time"
		}
		deadline = fmt.Sprintf("%s (%s)", d, key)
	}
	_, err = fmt.Fprintf(e.stdout, "ok\nbroker: %s\nredelivery deadline: %s\n", c.Broker, deadline)
	return err
}

func runConfigPrint(e *env, path string) error {
	c, src, err := loadConfig(path)
	if err != nil {
		return err
	}
	out, err := renderSources(effective(c), src)
	if err != nil {
		return err
	}
	_, err = io.WriteString(e.stdout, out)
	return err
}

// effective returns c, loaded with its defaults, as a router runs with
// it: also the zero fields whose default another package or router.New
// works out from other fields.
//
//   - each lane's weight 0 is 1;
//   - budget.autosize.deadline 0 is the broker's redelivery deadline,
//     window 0 is the deadline and min_busy 0 is window / 20 (sizing's
//     defaults);
//   - budget.autosize.ceiling 0 is the memory bound: memory_bound, or the
//     bound computed from memory_bytes.
//
// budget.autosize.parallelism 0 stays 0: it is the GOMAXPROCS of the
// process that runs the router. The result validates as c does.
func effective(c router.Config) router.Config {
	if len(c.Budget.Lanes) > 0 {
		c.Budget.Lanes = slices.Clone(c.Budget.Lanes)
		for i := range c.Budget.Lanes {
			if c.Budget.Lanes[i].Weight == 0 {
				c.Budget.Lanes[i].Weight = 1
			}
		}
	}
	a := &c.Budget.AutoSize
	if a.Deadline == 0 {
		a.Deadline = c.RedeliveryDeadline()
	}
	if a.Window == 0 {
		a.Window = a.Deadline
	}
	if a.MinBusy == 0 {
		a.MinBusy = a.Window / 20
	}
	if a.Ceiling == 0 {
		a.Ceiling = a.MemoryBound
		if a.Ceiling == 0 && a.MemoryBytes > 0 {
			a.Ceiling = sizing.MemoryBound(a.MemoryBytes, a.Processes, a.PrefetchBytes, a.BytesPerVertex)
		}
	}
	return c
}

// indexSuffix matches the element index validation appends to a list
// field, e.g. kafka.brokers[1].
var indexSuffix = regexp.MustCompile(`\[\d+\]$`)

// configProblems rewrites the errors of router.LoadConfigSources as one
// line each, "field (source): reason, got value", the source looked up in
// src when the error does not carry one. Errors that are not
// spillway.FieldErrors (an unreadable file, bad YAML) keep their text.
func configProblems(err error, src map[string]string) error {
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	lines := make([]string, 0, len(list))
	for _, e := range list {
		var ce *spillway.FieldError
		if !errors.As(e, &ce) {
			lines = append(lines, strings.TrimPrefix(e.Error(), "router: config: "))
			continue
		}
		source := ce.Source
		if source == "" {
			if s := src[indexSuffix.ReplaceAllString(ce.Field, "")]; s != "default" {
				source = s
			}
		}
		line := ce.Field
		if source != "" {
			line += " (" + source + ")"
		}
		line += ": " + ce.Reason
		if ce.Value != ce.Field || !strings.HasPrefix(source, "env ") { // an unknown variable's value is its name
			line += ", got " + strconv.Quote(ce.Value)
		}
		lines = append(lines, line)
	}
	return problems{err: err, lines: lines}
}

// problems is a configuration error printed one problem per line. It
// unwraps to the router's error.
type problems struct {
	err   error
	lines []string
}

func (p problems) Error() string { return strings.Join(p.lines, "\n") }
func (p problems) Unwrap() error { return p.err }

// renderSources renders c as YAML (secrets redacted, as router.Config
// marshals them) with a comment after each value naming its source in src.
func renderSources(c router.Config, src map[string]string) (string, error) {
	var doc yaml.Node
	if err := doc.Encode(c); err != nil {
		return "", err
	}
	annotate(&doc, "", src)
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return "", err
	}
	if err := enc.Close(); err != nil {
		return "", err
	}
	return b.String(), nil
}

// annotate walks the mapping n at path and sets the line comment of each
// leaf named in src. A scalar's comment follows its value; a list's or a
// mapping's follows its key.
func annotate(n *yaml.Node, path string, src map[string]string) {
	if n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		p := key.Value
		if path != "" {
			p = path + "." + key.Value
		}
		s, leaf := src[p]
		if !leaf {
			annotate(val, p, src)
			continue
		}
		if s == "default" {
			s = "# default"
		} else {
			s = "# from " + s
		}
		if val.Kind == yaml.ScalarNode || val.Style&yaml.FlowStyle != 0 || len(val.Content) == 0 {
			val.LineComment = s
		} else {
			key.LineComment = s
		}
		if val.Kind == yaml.SequenceNode {
			// A list of sections (budget.lanes): each item's keys
			// have sources of their own.
			for j, item := range val.Content {
				annotate(item, p+"["+strconv.Itoa(j)+"]", src)
			}
		}
	}
}
