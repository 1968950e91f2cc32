package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/router"
	"github.com/spillway-go/spillway/telemetry"
)

// lagOptions are the flags of "spillway lag".
type lagOptions struct {
	handlers  []string
	drainRate float64
	metrics   []string
	target    time.Duration
	json      bool
}

const (
	defaultLagTarget = 60 * time.Second
	// drainRateMetric is the per-process drain rate as the OpenTelemetry
	// Prometheus exporter names spillway.drain.rate.
	drainRateMetric = "spillway_drain_rate_per_second"
	// metricsTimeout bounds each --metrics request.
	metricsTimeout = 10 * time.Second
)

func newLagCmd(e *env) *cobra.Command {
	o := &lagOptions{target: defaultLagTarget}
	cmd := &cobra.Command{
		Use:   "lag FILE --handler NAME=TOPIC [flags]",
		Short: "Backlog in messages and vertices, drain time and the processes a target needs",
		Long: `lag reads, once, the backlog of consumer groups that running Spillway consumers
use: per Kafka partition or Redis stream, the messages not yet finished, their
estimated vertices and, given the vertices per second one process drains, how
long one process takes to drain them. Per group it prints the totals and how many
consumer processes drain the backlog within --target.

FILE is the consumers' router configuration, loaded like "spillway config
check" loads it (the YAML file, then the SPILLWAY_* environment). Name each
handler to inspect with --handler NAME=TOPIC: its group is consumer_group + "."
+ NAME, as the router names it. lag never joins a group, commits nothing and
creates no topic, stream or group; it reads offsets and samples records as
Router.Backlog does (docs/operations.md says what that costs the brokers).
The retry handler's group is read only when named: --handler NAME.retry=RETRY_TOPIC.
A Kafka group that never committed counts every message its topic retains;
on Redis the group must exist (a consumer creates it when it subscribes).

The drain rate is --drain-rate, or the average of spillway_drain_rate_per_second
(source telemetry.name) over the Prometheus endpoints given with --metrics, one
per running consumer process. Without either, drain times are left out.

The processes are ceil(vertices / rate / target), at least 1 while there is a
backlog, assuming the work spreads evenly over them. In Kafka partition mode
at most one process per partition receives work: the count is capped at the
partition count, and when one partition alone takes longer than the target no
number of processes meets it. Key mode (kafka.consumer: key) and Redis Streams
have no such cap.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runLag(cmd.Context(), e, o, args[0], cmd.Flags().Changed("drain-rate"))
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.handlers, "handler", nil, "a handler to inspect, NAME=TOPIC (repeatable; at least one)")
	f.Float64Var(&o.drainRate, "drain-rate", 0, "vertices per second one consumer process drains")
	f.StringArrayVar(&o.metrics, "metrics", nil, "Prometheus endpoint of a running consumer process, to read its drain rate (repeatable)")
	f.DurationVar(&o.target, "target", defaultLagTarget, "drain the backlog within this time")
	f.BoolVar(&o.json, "json", false, "print JSON instead of a table")
	return cmd
}

// lagHandler is one --handler.
type lagHandler struct{ name, topic string }

// validate checks the flags and returns the handlers.
func (o *lagOptions) validate(rateSet bool) ([]lagHandler, error) {
	if len(o.handlers) == 0 {
		return nil, badInput("--handler is required: name each handler to inspect as NAME=TOPIC, e.g. --handler parcels=parcels")
	}
	hs := make([]lagHandler, 0, len(o.handlers))
	seen := make(map[string]bool)
	for _, h := range o.handlers {
		name, topic, ok := strings.Cut(h, "=")
		name, topic = strings.TrimSpace(name), strings.TrimSpace(topic)
		if !ok || name == "" || topic == "" {
			return nil, badInput("--handler %q: want NAME=TOPIC, the handler's name as the consumers add it and the topic it consumes", h)
		}
		if seen[name] {
			return nil, badInput("--handler %q: handler %q is named twice; give each handler once", h, name)
		}
		seen[name] = true
		hs = append(hs, lagHandler{name, topic})
	}
	switch {
	case o.target <= 0:
		return nil, badInput("--target must be positive, got %v", o.target)
	case rateSet && len(o.metrics) > 0:
		return nil, badInput("--drain-rate and --metrics both given: give one")
	case rateSet && !(o.drainRate > 0 && !math.IsInf(o.drainRate, 1)):
		return nil, badInput("--drain-rate must be a positive number of vertices per second, got %v", o.drainRate)
	}
	for _, m := range o.metrics {
		u, err := url.Parse(m)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, badInput("--metrics %q: want the http(s) URL of a consumer's Prometheus endpoint, e.g. http://10.0.0.5:9464/metrics", m)
		}
	}
	return hs, nil
}

// lagReport is what "spillway lag" prints; --json prints it as is.
type lagReport struct {
	Broker        string     `json:"broker"`
	Mode          string     `json:"mode"` // partition or key on Kafka, streams on Redis
	TargetSeconds float64    `json:"target_seconds"`
	DrainRate     *lagRate   `json:"drain_rate"` // nil: not known
	Note          string     `json:"note,omitempty"`
	Groups        []lagGroup `json:"groups"`
}

// lagRate is the drain rate the report uses, and where it came from.
type lagRate struct {
	VerticesPerSecond float64 `json:"vertices_per_second"`
	// From is "--drain-rate" or "--metrics".
	From string `json:"from"`
	// Processes is how many series --metrics averaged.
	Processes int `json:"processes,omitempty"`
}

// lagGroup is one handler's consumer group on its topic.
type lagGroup struct {
	Handler  string   `json:"handler"`
	Group    string   `json:"group"`
	Topic    string   `json:"topic"`
	Messages int64    `json:"messages"`
	Vertices int64    `json:"vertices"`
	Seconds  *float64 `json:"drain_seconds"` // one process; nil without a rate
	// Processes drain the backlog within the target (capped at
	// ProcessCap); nil without a rate.
	Processes *int `json:"processes"`
	// ProcessCap is the most processes that receive work: the partition
	// count in Kafka partition mode, 0 for no cap.
	ProcessCap  int       `json:"process_cap,omitempty"`
	MeetsTarget *bool     `json:"meets_target"` // nil without a rate
	Note        string    `json:"note,omitempty"`
	Partitions  []lagPart `json:"partitions"`
}

// lagPart is one Kafka partition or Redis stream of a group.
type lagPart struct {
	Partition int32    `json:"partition"` // -1 on Redis
	Messages  int64    `json:"messages"`
	Vertices  int64    `json:"vertices"`
	Seconds   *float64 `json:"drain_seconds"` // one process; nil without a rate
}

func runLag(ctx context.Context, e *env, o *lagOptions, path string, rateSet bool) error {
	handlers, err := o.validate(rateSet)
	if err != nil {
		return err
	}
	cfg, _, err := loadConfig(path)
	if err != nil {
		return err
	}
	if err := notEmbedded(cfg); err != nil {
		return err
	}
	rep := &lagReport{Broker: cfg.Broker, Mode: lagMode(cfg), TargetSeconds: o.target.Seconds()}
	switch {
	case rateSet:
		rep.DrainRate = &lagRate{VerticesPerSecond: o.drainRate, From: "--drain-rate"}
	case len(o.metrics) > 0:
		rate, n, err := scrapeDrainRate(ctx, o.metrics, cfg.Telemetry.Name)
		if err != nil {
			return err
		}
		if n == 0 {
			rep.Note = fmt.Sprintf("no endpoint reports %s{source=%q} yet (a process reports it once it has measured its rate): drain times are left out",
				drainRateMetric, cfg.Telemetry.Name)
		} else {
			rep.DrainRate = &lagRate{VerticesPerSecond: rate, From: "--metrics", Processes: n}
		}
	default:
		rep.Note = "drain time needs the rate one process drains: give --drain-rate or --metrics"
	}
	backlog, err := readBacklog(ctx, cfg, handlers)
	if err != nil {
		return err
	}
	rep.Groups = lagGroups(cfg, handlers, backlog, rep.DrainRate, o.target)
	if o.json {
		return writeJSON(e.stdout, rep)
	}
	return printLag(e.stdout, rep)
}

// notEmbedded rejects an in-process broker: it exists only inside the
// process that started it, so its lag says nothing about the consumers'.
func notEmbedded(cfg router.Config) error {
	switch {
	case cfg.Broker == "kafka" && len(cfg.Kafka.Brokers) == 1 && cfg.Kafka.Brokers[0] == spillway.Embedded:
		return badInput("kafka.brokers is [embedded]: an embedded broker lives inside the process that runs it; " +
			"set kafka.brokers to the cluster the consumers use")
	case cfg.Broker == "redis" && cfg.Redis.Addr == spillway.Embedded:
		return badInput("redis.addr is embedded: an embedded server lives inside the process that runs it; " +
			"set redis.addr to the server the consumers use")
	}
	return nil
}

// lagMode names how the groups consume: Kafka's kafka.consumer, or
// streams on Redis.
func lagMode(cfg router.Config) string {
	switch cfg.Broker {
	case "kafka":
		return cfg.Kafka.Consumer
	case "redis":
		return "streams"
	}
	return ""
}

// readBacklog builds a router for the broker section of cfg, adds a
// handler that does nothing per --handler, reads Router.Backlog once and
// closes the router. The router never runs: its subscribers never join a
// group nor commit. Only what reading needs is kept of cfg: the broker,
// its section, the consumer group, and the budget's vertices and default
// cost (what an unstamped message is counted as, as the consumers' budget
// charges it). Topics are never created (neither
// by the router nor, on Kafka, by a metadata request), the retry gate and
// telemetry are off (no retry handlers, no lag sampler).
func readBacklog(ctx context.Context, cfg router.Config, handlers []lagHandler) ([]telemetry.LagSample, error) {
	rc := router.Config{Broker: cfg.Broker, ConsumerGroup: cfg.ConsumerGroup, Kafka: cfg.Kafka, Redis: cfg.Redis}
	rc.Budget.Vertices, rc.Budget.DefaultCost = cfg.Budget.Vertices, cfg.Budget.DefaultCost
	rc.Kafka.CreateTopics = false
	rc.Retry.Disabled = true
	rc.Telemetry.Disabled = true
	noAutoCreate := kafkabroker.WithSaramaConfig(func(c *sarama.Config) error {
		c.Metadata.AllowAutoTopicCreation = false
		return nil
	})
	r, err := router.New(rc, nil, router.WithKafka(noAutoCreate))
	if err != nil {
		if errors.Is(err, spillway.ErrInvalidConfig) {
			return nil, inputError{configProblems(err, nil)}
		}
		return nil, err
	}
	defer func() { _ = r.Close() }()
	for _, h := range handlers {
		if _, err := r.AddConsumerHandler(h.name, h.topic, func(*message.Message) error { return nil }); err != nil {
			return nil, fmt.Errorf("--handler %s=%s: %w", h.name, h.topic, err)
		}
	}
	backlog, err := r.Backlog(ctx)
	if errors.Is(err, router.ErrLagUnknown) {
		return nil, badInput("broker %s: %v: spillway lag reads Kafka consumer groups and Redis Streams; "+
			"give the configuration of consumers on broker kafka or redis", cfg.Broker, err)
	}
	return backlog, err
}

// lagGroups sorts the samples into one group per handler, in the order of
// the flags, with the drain times and processes at rate (nil: unknown).
func lagGroups(cfg router.Config, handlers []lagHandler, backlog []telemetry.LagSample, rate *lagRate, target time.Duration) []lagGroup {
	prefix := cfg.Kafka.ConsumerGroup
	if cfg.Broker == "redis" {
		prefix = cfg.Redis.ConsumerGroup
	}
	capped := cfg.Broker == "kafka" && cfg.Kafka.Consumer != kafkabroker.ConsumerKey
	seconds := func(v int64) *float64 {
		if rate == nil {
			return nil
		}
		s := float64(v) / rate.VerticesPerSecond
		return &s
	}
	out := make([]lagGroup, 0, len(handlers))
	for _, h := range handlers {
		g := lagGroup{Handler: h.name, Group: prefix + "." + h.name, Topic: h.topic, Partitions: []lagPart{}}
		var slowest lagPart // the partition with the most vertices
		for _, s := range backlog {
			if s.Group != g.Group || s.Topic != h.topic {
				continue
			}
			p := lagPart{Partition: s.Partition, Messages: max(s.Lag, 0), Vertices: max(s.Vertices, 0), Seconds: seconds(s.Vertices)}
			g.Partitions = append(g.Partitions, p)
			g.Messages += p.Messages
			g.Vertices += p.Vertices
			if len(g.Partitions) == 1 || p.Vertices > slowest.Vertices {
				slowest = p
			}
		}
		if capped {
			g.ProcessCap = len(g.Partitions)
		}
		if rate != nil {
			g.Seconds = seconds(g.Vertices)
			slowestSeconds := float64(slowest.Vertices) / rate.VerticesPerSecond
			n, meets := processesFor(*g.Seconds, g.Messages, target, g.ProcessCap, slowestSeconds)
			g.Processes, g.MeetsTarget = &n, &meets
			if !meets {
				g.Note = fmt.Sprintf("no number of processes drains it within %v in partition mode: partition %d alone takes %s, "+
					"and a partition is consumed by one process at a time", target, slowest.Partition, humanDuration(slowestSeconds))
			}
		}
		out = append(out, g)
	}
	return out
}

// processesFor returns how many processes, each draining one process's
// share of a backlog that takes one process seconds, drain it within
// target: ceil(seconds / target), at least 1 while messages wait, at most
// limit (0: no limit). slowest is the longest any one partition takes; in
// partition mode (limit > 0) one process at most consumes a partition, so
// the target cannot be met when slowest exceeds it or more than limit
// processes are needed.
func processesFor(seconds float64, messages int64, target time.Duration, limit int, slowest float64) (n int, meets bool) {
	if messages <= 0 {
		return 0, true
	}
	x := math.Ceil(seconds / target.Seconds())
	n = 1
	if x > 1 {
		n = int(min(x, math.MaxInt32))
	}
	if limit > 0 && (n > limit || slowest > target.Seconds()) {
		return min(n, limit), false
	}
	return n, true
}

// scrapeDrainRate reads the drain rate of each process at the endpoints
// and returns their average, as docs/scaling.md's
// avg(spillway_drain_rate_per_second{source=...}), and how many series it
// averaged. Processes that report no rate yet are left out.
func scrapeDrainRate(ctx context.Context, endpoints []string, source string) (float64, int, error) {
	var sum float64
	n := 0
	client := &http.Client{Timeout: metricsTimeout}
	for _, u := range endpoints {
		rates, err := scrapeOne(ctx, client, u, source)
		if err != nil {
			return 0, 0, fmt.Errorf("--metrics %s: %w", u, err)
		}
		for _, r := range rates {
			sum += r
			n++
		}
	}
	if n == 0 {
		return 0, 0, nil
	}
	return sum / float64(n), n, nil
}

// scrapeOne returns the values of the drain rate series of source on one
// endpoint, in the Prometheus text exposition format.
func scrapeOne(ctx context.Context, client *http.Client, u, source string) ([]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the Prometheus text format: %w", err)
	}
	var out []float64
	for _, m := range families[drainRateMetric].GetMetric() {
		src := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "source" {
				src = l.GetValue()
			}
		}
		if src != source {
			continue
		}
		var v float64
		switch {
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Untyped != nil:
			v = m.GetUntyped().GetValue()
		default:
			continue
		}
		if v > 0 && !math.IsInf(v, 0) {
			out = append(out, v)
		}
	}
	return out, nil
}

// printLag writes the report as two tables, partitions then groups, and
// the notes.
func printLag(w io.Writer, r *lagReport) error {
	rate := "unknown"
	if d := r.DrainRate; d != nil {
		rate = fmt.Sprintf("%.0f vertices/s per process (%s)", d.VerticesPerSecond, d.From)
		if d.Processes > 0 {
			rate = fmt.Sprintf("%.0f vertices/s per process (--metrics: average of %d)", d.VerticesPerSecond, d.Processes)
		}
	}
	mode := r.Broker
	if r.Broker == "kafka" {
		mode += ", " + r.Mode + " mode"
	}
	fmt.Fprintf(w, "broker: %s\ndrain rate: %s\ntarget: %s\n\n", mode, rate, humanDuration(r.TargetSeconds))
	opt := func(s *float64) string {
		if s == nil {
			return "-"
		}
		return humanDuration(*s)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HANDLER\tGROUP\tTOPIC\tPARTITION\tMESSAGES\tVERTICES (EST.)\tDRAIN TIME (1 PROCESS)")
	for _, g := range r.Groups {
		for _, p := range g.Partitions {
			part := "-"
			if p.Partition >= 0 {
				part = fmt.Sprint(p.Partition)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", g.Handler, g.Group, g.Topic, part, p.Messages, p.Vertices, opt(p.Seconds))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "GROUP\tMESSAGES\tVERTICES (EST.)\tDRAIN TIME (1 PROCESS)\tPROCESSES FOR %s\n", humanDuration(r.TargetSeconds))
	for _, g := range r.Groups {
		procs := "-"
		if g.Processes != nil {
			procs = fmt.Sprint(*g.Processes)
			if g.ProcessCap > 0 {
				procs += fmt.Sprintf(" (of at most %d)", g.ProcessCap)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", g.Group, g.Messages, g.Vertices, opt(g.Seconds), procs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var notes []string
	if r.Note != "" {
		notes = append(notes, r.Note)
	}
	for _, g := range r.Groups {
		if g.Note != "" {
			notes = append(notes, g.Group+": "+g.Note)
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
	}
	for _, n := range notes {
		if _, err := fmt.Fprintln(w, n); err != nil {
			return err
		}
	}
	return nil
}

// humanDuration renders seconds for a table: tenths of a second below
// 10 s, whole seconds up to a day, whole minutes beyond.
func humanDuration(s float64) string {
	switch {
	case math.IsInf(s, 1) || s*float64(time.Second) >= math.MaxInt64:
		return "forever"
	case s < 10:
		return time.Duration(s * float64(time.Second)).Round(100 * time.Millisecond).String()
	case s < 86400:
		return time.Duration(s * float64(time.Second)).Round(time.Second).String()
	}
	return time.Duration(s * float64(time.Second)).Round(time.Minute).String()
}
