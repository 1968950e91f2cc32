package demo

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/refwork"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/router"
	"github.com/spillway-go/spillway/sizing"
)

// The consumer groups the demo compares.
const (
	// GroupNaive is Watermill's defaults: a plain router and watermill-kafka
	// subscribers, concurrency = one unacked message per partition, no
	// budget.
	GroupNaive = "naive"
	// GroupSpillway is the Spillway router: a vertex budget sized from
	// measurements and auto-sized online, split into a light lane for
	// the positions handler (with a reserved share, see [PositionsLane])
	// and a lane for the rest; revocation-aware admission, shedding of the
	// positions topic and the retry gate.
	GroupSpillway = "spillway"
	// GroupSingleLane is GroupSpillway with one FIFO budget, no lanes:
	// the baseline the lanes are measured against, on the same stream.
	GroupSingleLane = "spillway-1lane"
	// GroupSpillwayKey is the Spillway router with kafka.consumer key:
	// messages of different keys in flight together, whatever the
	// partition count (Kafka only; "spillway demo --kafka-consumer key").
	GroupSpillwayKey = "spillway-key"
)

// Groups lists the groups in the order they run.
var Groups = []string{GroupNaive, GroupSpillway, GroupSingleLane}

// AllGroups lists every group the demo knows.
var AllGroups = []string{GroupNaive, GroupSpillway, GroupSingleLane, GroupSpillwayKey}

var groupDescriptions = map[string]string{
	GroupNaive:       "Watermill defaults: the broker's upstream subscribers, message-count concurrency, no budget",
	GroupSpillway:    "Spillway router: measured vertex budget with auto-sizing and a light lane for positions, revocation-aware admission, shedding, retry gate",
	GroupSingleLane:  "the same Spillway router with one FIFO budget (no lanes)",
	GroupSpillwayKey: "Spillway router with kafka.consumer key: the same stack, messages of different keys in flight together within a per-partition window",
}

// PositionsLane is the share of the budget the Spillway group reserves for
// the positions handler's lane. The pings it admits are tiny, so a small
// share keeps them clear of the heavy boundaries.
const PositionsLane = 0.02

// isSpillway reports whether group runs the Spillway router.
func isSpillway(group string) bool {
	return group == GroupSpillway || group == GroupSingleLane || group == GroupSpillwayKey
}

// Options configures a demo run. Zero fields take the defaults of
// [DefaultOptions] (see [Options.withDefaults]).
type Options struct {
	Broker string `json:"broker"` // kafka (embedded) or redis

	Seed          uint64        `json:"seed"`
	Duration      time.Duration `json:"duration"`    // production per group
	PingRate      float64       `json:"ping_rate"`   // pings per second
	Vehicles      int           `json:"vehicles"`    // vehicles pinging
	ParcelRate    float64       `json:"parcel_rate"` // parcels per second
	Burst         int           `json:"burst"`       // heavy multipolygons in the burst
	BurstAt       time.Duration `json:"burst_at"`    // when the burst is published
	HeavyVertices int           `json:"heavy_vertices"`
	Partitions    int           `json:"partitions"` // per topic
	FailRate      float64       `json:"fail_rate"`  // first attempts that fail

	// Deadline is the redelivery deadline (Kafka Rebalance.Timeout) of
	// both groups, scaled down so the demo is short.
	Deadline time.Duration `json:"deadline"`
	// Heartbeat is both groups' heartbeat interval.
	Heartbeat time.Duration `json:"heartbeat"`
	// JoinAfter is how long after the burst the second member joins.
	JoinAfter time.Duration `json:"join_after"`
	// Drain is the most each group gets after production ends.
	Drain time.Duration `json:"drain"`
	// HeavyShare is the share of Deadline one heavy message takes alone on
	// one core: it sets the handler's work passes. Default 1/3 on Kafka,
	// where the plain consumer has one heavy message per partition in
	// flight; 0.5 on Redis, where it has one per topic and one read ahead,
	// so only a message slower than half the deadline is claimed.
	HeavyShare float64 `json:"heavy_share"`
	// Passes, if positive, replaces the calibrated passes.
	Passes int `json:"passes"`
	// CalibrationRepeats is how many throughput runs the calibration takes
	// the median of.
	CalibrationRepeats int `json:"calibration_repeats"`
	// MemoryBytes is the memory the consumer process gives in-flight
	// geometry: the memory bound on the chart and the auto-sizer's ceiling.
	MemoryBytes int64 `json:"memory_bytes"`

	SampleEvery time.Duration `json:"sample_every"` // time-series resolution
	LagEvery    time.Duration `json:"lag_every"`    // how often lag is read

	Groups []string `json:"groups"` // which groups to run, in order

	// StopWhenFailed ends a group's run as soon as production has ended
	// and the group has shown the failure (work done twice, an eviction, a
	// late rebalance), instead of letting it drain. Tests use it.
	StopWhenFailed bool `json:"-"`

	// OnPhase, if set, is told what the demo is doing ("calibrating", ...).
	OnPhase func(string) `json:"-"`
	// OnProgress, if set, gets a snapshot of the running group about once
	// a second.
	OnProgress func(Progress) `json:"-"`
}

// DefaultOptions are the defaults of "spillway demo": both groups finish
// in under two minutes on two cores.
func DefaultOptions() Options {
	return Options{
		Broker:             "kafka",
		Seed:               1,
		Duration:           25 * time.Second,
		PingRate:           200,
		Vehicles:           300,
		ParcelRate:         40,
		Burst:              12,
		BurstAt:            6 * time.Second,
		HeavyVertices:      20_000,
		Partitions:         12,
		FailRate:           0.01,
		Deadline:           4 * time.Second,
		Heartbeat:          500 * time.Millisecond,
		JoinAfter:          time.Second,
		Drain:              15 * time.Second,
		HeavyShare:         1.0 / 3,
		CalibrationRepeats: 1,
		MemoryBytes:        96 << 20,
		SampleEvery:        200 * time.Millisecond,
		LagEvery:           500 * time.Millisecond,
		Groups:             Groups,
	}
}

// withDefaults fills every zero field from DefaultOptions.
func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.Broker == "" {
		o.Broker = d.Broker
	}
	if o.Seed == 0 {
		o.Seed = d.Seed
	}
	if o.Duration == 0 {
		o.Duration = d.Duration
	}
	if o.PingRate == 0 {
		o.PingRate = d.PingRate
	}
	if o.Vehicles == 0 {
		o.Vehicles = d.Vehicles
	}
	if o.ParcelRate == 0 {
		o.ParcelRate = d.ParcelRate
	}
	if o.HeavyVertices == 0 {
		o.HeavyVertices = d.HeavyVertices
	}
	if o.Partitions == 0 {
		o.Partitions = d.Partitions
	}
	if o.Deadline == 0 {
		o.Deadline = d.Deadline
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = min(d.Heartbeat, o.Deadline/8)
	}
	if o.JoinAfter == 0 {
		o.JoinAfter = o.Deadline / 4
	}
	if o.Drain == 0 {
		o.Drain = d.Drain
	}
	if o.HeavyShare == 0 {
		o.HeavyShare = d.HeavyShare
		if o.Broker == "redis" {
			o.HeavyShare = 0.5
		}
	}
	if o.CalibrationRepeats == 0 {
		o.CalibrationRepeats = d.CalibrationRepeats
	}
	if o.MemoryBytes == 0 {
		o.MemoryBytes = d.MemoryBytes
	}
	if o.SampleEvery == 0 {
		o.SampleEvery = d.SampleEvery
	}
	if o.LagEvery == 0 {
		o.LagEvery = d.LagEvery
	}
	if len(o.Groups) == 0 {
		o.Groups = d.Groups
	}
	return o
}

// ErrBadOptions wraps every problem Options.Validate finds.
var ErrBadOptions = errors.New("demo: bad options")

// Validate reports the first unusable option (after defaults).
func (o Options) Validate() error {
	o = o.withDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadOptions, fmt.Sprintf(format, args...))
	}
	switch {
	case o.Broker != "kafka" && o.Broker != "redis":
		return bad("broker must be kafka or redis, got %q", o.Broker)
	case o.Deadline < 100*time.Millisecond || o.Deadline%time.Millisecond != 0:
		return bad("deadline must be a whole number of milliseconds, at least 100ms, got %s", o.Deadline)
	case o.Heartbeat <= 0 || o.Heartbeat >= o.Deadline:
		return bad("heartbeat must be positive and below the deadline, got %s", o.Heartbeat)
	case o.HeavyShare <= 0 || o.HeavyShare > 1:
		return bad("heavy share must be in (0, 1], got %v", o.HeavyShare)
	case o.MemoryBytes <= 0:
		return bad("memory must be positive, got %d", o.MemoryBytes)
	case o.Drain < 0:
		return bad("drain must not be negative, got %s", o.Drain)
	case o.Passes < 0:
		return bad("passes must not be negative, got %d", o.Passes)
	}
	for _, g := range o.Groups {
		if !slices.Contains(AllGroups, g) {
			return bad("unknown group %q (have %s)", g, strings.Join(AllGroups, ", "))
		}
		if g == GroupSpillwayKey && o.Broker == "redis" {
			return bad("group %s needs broker kafka", g)
		}
	}
	if err := o.streamConfig().Validate(); err != nil {
		return bad("%v", err)
	}
	return nil
}

func (o Options) streamConfig() StreamConfig {
	return StreamConfig{
		Seed: o.Seed, Duration: o.Duration, PingRate: o.PingRate, Vehicles: o.Vehicles, ParcelRate: o.ParcelRate,
		Burst: o.Burst, BurstAt: o.BurstAt, HeavyVertices: o.HeavyVertices, Partitions: o.Partitions, FailRate: o.FailRate,
	}
}

// Progress is a snapshot of the running group for a live view.
type Progress struct {
	Group        string
	T            time.Duration // since the group started producing
	Producing    bool
	Published    int
	Total        int
	Accounted    int // completed, shed or dead-lettered
	Completed    int // unique completions
	VerticesPerS float64
	Fill         float64 // budget in use / capacity; NaN without a budget
	Budget       int64
	Inflight     int64
	Lag          int64 // -1 unknown
	Shed         int
	Redeliveries int
	Duplicates   int
	Evictions    int
	Members      int
}

// ErrRedisNotSupported is returned by Run for broker redis while the
// router cannot run on Redis Streams yet.
var ErrRedisNotSupported = errors.New("demo: the router does not support broker redis yet")

// Run runs the demo: load the geometry, generate the stream, calibrate,
// then run each group in turn on a fresh embedded cluster.
func Run(ctx context.Context, o Options) (*Recording, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	if o.Broker == "redis" {
		if err := checkRedis(); err != nil {
			return nil, err
		}
		if _, err := exec.LookPath("redis-server"); err != nil {
			return nil, ErrNoRedisServer
		}
	}
	phase := func(format string, args ...any) {
		if o.OnPhase != nil {
			o.OnPhase(fmt.Sprintf(format, args...))
		}
	}
	rec := &Recording{Started: time.Now(), Machine: thisMachine(), Options: o}
	phase("loading geometry from testdata")
	g, err := LoadGeometry()
	if err != nil {
		return nil, err
	}
	st, err := Generate(g, o.streamConfig())
	if err != nil {
		return nil, err
	}
	rec.Stream = streamInfo(st)
	phase("calibrating the reference handler on %d cores", runtime.GOMAXPROCS(0))
	if rec.Calibration, err = calibrateStream(ctx, g, st, o); err != nil {
		return nil, err
	}
	for _, name := range o.Groups {
		if err := ctx.Err(); err != nil {
			return rec, err
		}
		runtime.GC()
		phase("running %s: %s", name, groupDescriptions[name])
		gr, err := runGroup(ctx, name, st, rec.Calibration, o)
		if gr != nil {
			rec.Groups = append(rec.Groups, gr)
		}
		if err != nil {
			return rec, fmt.Errorf("demo: %s: %w", name, err)
		}
	}
	return rec, nil
}

// checkRedis reports whether this build's router runs on Redis Streams.
func checkRedis() error {
	cfg := router.Config{Broker: "redis"}
	cfg.Redis.Addr = "embedded"
	r, err := router.New(cfg, nil)
	if err != nil {
		return fmt.Errorf("%w: router.New: %v", ErrRedisNotSupported, err)
	}
	return r.Close()
}

var (
	errBlip      = errors.New("demo: downstream blip (injected)")
	errAbandoned = errors.New("demo: abandoned at teardown")
)

// member is one consumer of a group: a plain Watermill router or a
// Spillway router, with what the demo watches on it.
type member struct {
	name   string
	obs    *observer
	logger *recordingLogger
	sr     *router.Router // nil for the plain consumer
	close  func() error
	runErr chan error
	// resizes counts the auto-sizer's resizes of the member's budget.
	resizes atomic.Int64
}

// groupRun is one group's run in progress.
type groupRun struct {
	name  string
	st    *Stream
	cal   Calibration
	o     Options
	env   brokerEnv
	rec   *GroupRecording
	start time.Time

	stopping atomic.Bool
	inflight atomic.Int64
	lag      atomic.Int64

	mu          sync.Mutex
	attempts    map[string]int
	completions map[string]int
	accounted   map[string]struct{}
	members     []*member
	done        chan struct{}
	published   atomic.Int64
	pubAt       []time.Duration // per stream message, since start; written by produce
	vertices    atomic.Int64
	shed        atomic.Int64
	redeliver   atomic.Int64
	dups        atomic.Int64
}

func (gr *groupRun) since() float64 { return time.Since(gr.start).Seconds() }

// event records what happened, until measuring stops.
func (gr *groupRun) event(what string) {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	if !gr.stopping.Load() {
		gr.rec.Events = append(gr.rec.Events, Event{T: gr.since(), What: what})
	}
}

// account marks uuid as done with (completed, shed or dead-lettered).
// Called with gr.mu held.
func (gr *groupRun) accountLocked(uuid string) {
	if _, ok := gr.accounted[uuid]; ok {
		return
	}
	gr.accounted[uuid] = struct{}{}
	if len(gr.accounted) == len(gr.st.Messages) {
		gr.rec.Drained = gr.since()
		close(gr.done)
	}
}

func kindOf(uuid string) Kind {
	for k, n := range kindNames {
		if strings.HasPrefix(uuid, n+"-") {
			return Kind(k)
		}
	}
	return KindPing
}

// handle is the reference handler both groups run: decode, then area,
// centroid and convex hull, passes times; the first attempt of a few
// messages fails, as if a downstream call had failed.
func (gr *groupRun) handle(msg *message.Message) error {
	n, _ := cost.ParseCount(msg.Metadata.Get(cost.MetadataKey), len(msg.Payload))
	gr.mu.Lock()
	gr.attempts[msg.UUID]++
	attempt := gr.attempts[msg.UUID]
	gr.rec.Attempts++
	switch {
	case attempt == 2 && msg.Metadata.Get(MetaFailFirst) == "1":
		gr.rec.Retries++ // the failed first attempt, tried again
	case attempt > 1:
		gr.rec.Redeliveries++ // handed over by a rebalance, or run again after a lost ack
		gr.redeliver.Add(1)
	}
	gr.mu.Unlock()
	if attempt == 1 && msg.Metadata.Get(MetaFailFirst) == "1" {
		gr.mu.Lock()
		gr.rec.Failures++
		gr.mu.Unlock()
		return errBlip
	}

	gr.inflight.Add(n)
	_, ok, err := refwork.ProcessUntil(refwork.Full, msg.Payload, gr.cal.Passes, gr.stopping.Load)
	gr.inflight.Add(-n)
	if err != nil {
		return retrygate.Permanent(err)
	}
	if !ok {
		gr.mu.Lock()
		gr.rec.Abandoned++
		gr.mu.Unlock()
		return errAbandoned
	}

	now := time.Now()
	var lat float64
	if ns, err := strconv.ParseInt(msg.Metadata.Get(MetaPublishedAt), 10, 64); err == nil {
		lat = now.Sub(time.Unix(0, ns)).Seconds()
	}
	gr.mu.Lock()
	defer gr.mu.Unlock()
	if gr.stopping.Load() {
		return nil // after measuring ended: not counted
	}
	gr.completions[msg.UUID]++
	gr.rec.Completions++
	if gr.completions[msg.UUID] == 1 {
		gr.rec.Unique++
		gr.rec.VerticesDone += n
		gr.vertices.Add(n)
	} else {
		gr.rec.Duplicates++
		gr.rec.DupVertices += n
		gr.dups.Add(1)
	}
	gr.rec.Latencies = append(gr.rec.Latencies, Latency{T: now.Sub(gr.start).Seconds(), Seconds: lat, Kind: kindOf(msg.UUID)})
	gr.accountLocked(msg.UUID)
	return nil
}

func (gr *groupRun) onShed(msg *message.Message, _, reason string) {
	gr.shed.Add(1)
	gr.mu.Lock()
	defer gr.mu.Unlock()
	if gr.stopping.Load() {
		return
	}
	gr.rec.Shed++
	if gr.rec.ShedByReason == nil {
		gr.rec.ShedByReason = map[string]int{}
	}
	gr.rec.ShedByReason[reason]++
	gr.accountLocked(msg.UUID)
}

func (gr *groupRun) onRetry(ev retrygate.Event) {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	if gr.stopping.Load() {
		return
	}
	switch ev.Outcome {
	case retrygate.DeadLettered:
		gr.rec.DeadLettered++
		gr.accountLocked(ev.Message.UUID)
	case retrygate.Deferred:
		gr.rec.Deferred++
	}
}

// memberHooks are a Spillway member's router hooks (OnShed,
// OnRetryOutcome and OnResize, see router.WithHooks): they feed the run's
// record.
type memberHooks struct {
	gr *groupRun
	m  *member
}

func (h memberHooks) OnShed(msg *message.Message, topic, reason string) {
	h.gr.onShed(msg, topic, reason)
}

func (h memberHooks) OnRetryOutcome(ev retrygate.Event) { h.gr.onRetry(ev) }

func (h memberHooks) OnResize(from, to int64, _ sizing.Bounds) {
	h.m.resizes.Add(1)
	go h.gr.event(fmt.Sprintf("member %s: auto-sizer resized the budget %d -> %d vertices", h.m.name, from, to))
}

func (gr *groupRun) newMember(ctx context.Context, name string) (*member, error) {
	m := &member{name: name, logger: &recordingLogger{}, runErr: make(chan error, 1)}
	m.obs = &observer{member: name, onEv: func(ev SessionEvent) {
		gr.mu.Lock()
		gr.rec.Sessions = append(gr.rec.Sessions, ev)
		gr.mu.Unlock()
		if ev.Evicted {
			gr.event(fmt.Sprintf("member %s evicted from the %s group: its deliveries went to the other member", ev.Member, ev.Topic))
		}
	}}
	switch gr.name {
	case GroupNaive:
		if err := gr.startNaive(ctx, m); err != nil {
			return nil, err
		}
	case GroupSpillway, GroupSingleLane, GroupSpillwayKey:
		if err := gr.startSpillway(ctx, m); err != nil {
			return nil, err
		}
	}
	gr.mu.Lock()
	gr.members = append(gr.members, m)
	gr.mu.Unlock()
	return m, nil
}

// startNaive runs a member of the plain consumer: Watermill's router and
// the broker's upstream subscribers (watermill-kafka, watermill-redisstream),
// nothing else.
func (gr *groupRun) startNaive(ctx context.Context, m *member) error {
	wm, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, m.logger)
	if err != nil {
		return err
	}
	for _, t := range []string{TopicPositions, TopicBoundaries} {
		sub, err := gr.env.naiveSubscriber(m, t)
		if err != nil {
			return err
		}
		wm.AddConsumerHandler(t, t, sub, gr.handle)
	}
	go func() { m.runErr <- wm.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-wm.Running():
	case err := <-m.runErr:
		return fmt.Errorf("plain router: %w", err)
	}
	m.close = wm.Close
	return nil
}

// spillwayConfig is the Spillway router's configuration for the demo, but
// for the broker's section (brokerEnv.spillwayConfig).
func spillwayConfig(o Options, cal Calibration, group string) router.Config {
	cfg := router.Config{CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = cal.Budget
	if group == GroupSpillway || group == GroupSpillwayKey {
		// Pings (and their retries: the router names the retry handler
		// of handler t "<t>.retry") in a light lane with a reserved
		// share; everything else in the boundaries lane.
		cfg.Budget.Lanes = []middleware.Lane{
			{Name: "positions", Handlers: []string{TopicPositions, TopicPositions + ".retry"}, Reserve: PositionsLane},
			{Name: "boundaries"},
		}
	}
	a := &cfg.Budget.AutoSize
	a.Enabled = true
	a.MemoryBound = cal.MemoryBound
	// Floor and ceiling: what an operator would accept as fixed budgets.
	// The auto-sizer may halve the calibrated budget (two members sharing
	// the machine each get half of it) or raise it by half.
	a.Floor = max(1, cal.Budget/2)
	a.Ceiling = min(cal.MemoryBound, cal.Budget*3/2)
	sh := &cfg.Shedding
	sh.Topics = []string{TopicPositions}
	sh.EntityKey, sh.VersionKey = MetaEntity, MetaVersion
	sh.VersionGuard.Enabled = true
	sh.Priority.Key = MetaPriority
	sh.Priority.Window = o.Deadline / 2
	r := &cfg.Retry
	r.InitialInterval = max(time.Millisecond, o.Deadline/80)
	r.MaxInterval = max(time.Millisecond, o.Deadline/16)
	r.MaxElapsedTime = max(time.Millisecond, o.Deadline/4)
	return cfg
}

// startSpillway runs a member of the Spillway group: the router, built from
// configuration, with the demo's hooks.
func (gr *groupRun) startSpillway(ctx context.Context, m *member) error {
	cfg := spillwayConfig(gr.o, gr.cal, gr.name)
	gr.env.spillwayConfig(&cfg, m)
	if gr.name == GroupSpillwayKey {
		cfg.Kafka.Consumer = kafkabroker.ConsumerKey
		cfg.Kafka.ConsumerGroup = GroupSpillwayKey
	}
	opts := append(gr.env.routerOptions(m), router.WithHooks(memberHooks{gr, m}))
	r, err := router.New(cfg, m.logger, opts...)
	if err != nil {
		return err
	}
	for _, t := range []string{TopicPositions, TopicBoundaries} {
		if _, err := r.AddConsumerHandler(t, t, gr.handle); err != nil {
			_ = r.Close()
			return err
		}
	}
	go func() { m.runErr <- r.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-r.Running():
	case err := <-m.runErr:
		return fmt.Errorf("spillway router: %w", err)
	}
	m.sr, m.close = r, r.Close
	return nil
}

// runGroup runs one group on a fresh broker.
func runGroup(ctx context.Context, name string, st *Stream, cal Calibration, o Options) (*GroupRecording, error) {
	env, err := newEnv(o)
	if err != nil {
		return nil, err
	}
	defer env.close()
	gr := &groupRun{
		name: name, st: st, cal: cal, o: o, env: env,
		rec:         &GroupRecording{Name: name, Description: groupDescriptions[name], JoinedAt: -1, Noticed: -1, Rebalance: -1, Drained: -1},
		pubAt:       make([]time.Duration, len(st.Messages)),
		attempts:    map[string]int{},
		completions: map[string]int{},
		accounted:   map[string]struct{}{},
		done:        make(chan struct{}),
	}
	gr.rec.Published = len(st.Messages)
	gr.lag.Store(-1)
	pub := cost.NewStampingPublisher(env.publisher())

	gr.start = time.Now() // provisional, for events before production
	a, err := gr.newMember(ctx, "a")
	if err != nil {
		return nil, err
	}
	defer gr.teardown()
	// Production starts once the first member consumes both topics.
	for ready := time.Now().Add(30 * time.Second); env.sessions(); {
		if !a.obs.firstSession(TopicPositions).IsZero() && !a.obs.firstSession(TopicBoundaries).IsZero() {
			break
		}
		if time.Now().After(ready) {
			return gr.rec, errors.New("the first consumer never joined its groups")
		}
		select {
		case <-ctx.Done():
			return gr.rec, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}

	gr.mu.Lock()
	gr.start = time.Now()
	gr.rec.Events = nil
	gr.mu.Unlock()
	sampling, stopSampling := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); gr.sample(sampling) }()
	go func() { defer wg.Done(); gr.readLag(sampling) }()

	prodErr := make(chan error, 1)
	produced := make(chan struct{})
	go func() {
		err := gr.produce(sampling, pub)
		close(produced)
		prodErr <- err
	}()

	// The second member joins mid-burst, forcing a rebalance of both
	// groups while the first member has the burst in flight.
	joinErr := make(chan error, 1)
	go func() {
		select {
		case <-sampling.Done():
			joinErr <- nil
			return
		case <-time.After(time.Until(gr.start.Add(o.BurstAt + o.JoinAfter))):
		}
		joined := time.Now()
		gr.mu.Lock()
		gr.rec.JoinedAt = joined.Sub(gr.start).Seconds()
		gr.mu.Unlock()
		if env.sessions() {
			gr.event("second consumer joins: rebalance")
		} else {
			gr.event("second consumer joins: it claims entries idle past the deadline")
		}
		b, err := gr.newMember(ctx, "b")
		if err != nil {
			joinErr <- err
			return
		}
		joinErr <- nil
		for env.sessions() {
			if t := b.obs.firstSession(TopicBoundaries); !t.IsZero() {
				// The rebalance as the group lived it: from the first
				// member learning of it (its session ended) to the new
				// member's first session.
				from := a.obs.sessionEndAfter(TopicBoundaries, joined)
				if from.IsZero() || from.After(t) {
					from = joined
				}
				gr.mu.Lock()
				gr.rec.Noticed = from.Sub(gr.start).Seconds()
				gr.rec.Rebalance = t.Sub(from).Seconds()
				gr.mu.Unlock()
				gr.event(fmt.Sprintf("rebalance of the boundaries group done in %.1fs", t.Sub(from).Seconds()))
				return
			}
			select {
			case <-sampling.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	var runErr error
	select {
	case <-gr.done:
	case <-ctx.Done():
		runErr = ctx.Err()
	case <-func() <-chan struct{} {
		c := make(chan struct{})
		go func() {
			<-produced
			gr.event("production ends")
			limit := time.After(o.Drain)
			for {
				select {
				case <-limit:
				case <-gr.done:
				case <-sampling.Done():
				case <-time.After(100 * time.Millisecond):
					if !o.StopWhenFailed || !gr.failed() {
						continue
					}
				}
				break
			}
			close(c)
		}()
		return c
	}():
	}
	gr.mu.Lock()
	drained := gr.rec.Drained >= 0
	gr.mu.Unlock()
	if drained {
		gr.event("every message accounted for")
	}
	gr.mu.Lock()
	gr.rec.Ended = gr.since()
	gr.stopping.Store(true)
	gr.mu.Unlock()
	stopSampling()
	wg.Wait()
	if err := <-prodErr; err != nil && !errors.Is(err, context.Canceled) && runErr == nil {
		runErr = fmt.Errorf("producing: %w", err)
	}
	if err := <-joinErr; err != nil && runErr == nil {
		runErr = fmt.Errorf("second consumer: %w", err)
	}
	gr.finish(int(gr.published.Load()))
	return gr.rec, runErr
}

// failed reports whether the group has shown the failure so far.
func (gr *groupRun) failed() bool {
	gr.mu.Lock()
	ms := slices.Clone(gr.members)
	late := gr.env.sessions() && gr.rec.JoinedAt >= 0 && (gr.rec.Rebalance > gr.o.Deadline.Seconds() ||
		gr.rec.Rebalance < 0 && gr.since()-gr.rec.JoinedAt > gr.o.Deadline.Seconds()+1)
	dups := gr.rec.Duplicates > 0
	gr.mu.Unlock()
	evicted := 0
	for _, m := range ms {
		evicted += m.obs.evictions()
	}
	return dups || late || evicted > 0
}

// finish copies the members' counters into the recording, and records
// the age of every published message that was never done with.
func (gr *groupRun) finish(published int) {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	r := gr.rec
	r.Members = len(gr.members)
	r.Accounted = len(gr.accounted)
	for i, m := range gr.st.Messages[:published] {
		if _, ok := gr.accounted[m.UUID]; !ok {
			r.Unfinished = append(r.Unfinished, Latency{T: r.Ended, Seconds: r.Ended - gr.pubAt[i].Seconds(), Kind: m.Kind})
		}
	}
	for _, m := range gr.members {
		r.Evictions += m.obs.evictions()
		lost, _ := m.logger.counts()
		r.LostMembership += lost
		if m.sr != nil {
			st := m.sr.Stats()
			r.Revocations += st.Revocations
			r.LateMarks += st.LateMarks
			if st.AutoSize != nil {
				r.Resizes += int(m.resizes.Load())
			}
		}
	}
}

// teardown closes every member; handlers still running give up.
func (gr *groupRun) teardown() {
	gr.stopping.Store(true)
	gr.mu.Lock()
	ms := slices.Clone(gr.members)
	gr.mu.Unlock()
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = m.close()
			select {
			case <-m.runErr:
			case <-time.After(30 * time.Second):
			}
		}()
	}
	wg.Wait()
}

// produce publishes the stream on its schedule, stamping each message's
// publication time (and, through the stamping publisher, its cost).
func (gr *groupRun) produce(ctx context.Context, pub message.Publisher) error {
	msgs := gr.st.Messages
	burstSeen := false
	for i := 0; i < len(msgs); {
		due := gr.start.Add(msgs[i].At)
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		elapsed := time.Since(gr.start)
		byTopic := map[string][]*message.Message{}
		j := i
		for ; j < len(msgs) && msgs[j].At <= elapsed && j-i < 1000; j++ {
			m := msgs[j]
			wm := message.NewMessage(m.UUID, m.Payload)
			wm.Metadata.Set(MetaEntity, m.Key)
			if m.Kind == KindPing {
				wm.Metadata.Set(MetaVersion, strconv.FormatUint(m.Version, 10))
				wm.Metadata.Set(MetaPriority, strconv.Itoa(m.Priority))
			}
			if m.FailFirst {
				wm.Metadata.Set(MetaFailFirst, "1")
			}
			if m.Kind == KindHeavy && !burstSeen {
				burstSeen = true
				gr.event(fmt.Sprintf("burst: %d heavy multipolygons published", gr.st.Count[KindHeavy]))
			}
			byTopic[m.Topic] = append(byTopic[m.Topic], wm)
		}
		at := time.Now()
		now := strconv.FormatInt(at.UnixNano(), 10)
		for k := i; k < j; k++ {
			gr.pubAt[k] = at.Sub(gr.start)
		}
		gr.published.Add(int64(j - i))
		for _, t := range []string{TopicPositions, TopicBoundaries} {
			if len(byTopic[t]) == 0 {
				continue
			}
			for _, wm := range byTopic[t] {
				wm.Metadata.Set(MetaPublishedAt, now)
			}
			if err := pub.Publish(t, byTopic[t]...); err != nil {
				return err
			}
		}
		i = j
	}
	return nil
}

// sample records the time series and reports progress once a second.
func (gr *groupRun) sample(ctx context.Context) {
	tick := time.NewTicker(gr.o.SampleEvery)
	defer tick.Stop()
	lastReport, lastVertices := time.Now(), int64(0)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s := Sample{
				T:            now.Sub(gr.start).Seconds(),
				Inflight:     gr.inflight.Load(),
				Heap:         heapBytes(),
				Vertices:     gr.vertices.Load(),
				Shed:         gr.shed.Load(),
				Redeliveries: gr.redeliver.Load(),
				Duplicates:   gr.dups.Load(),
				Lag:          gr.lag.Load(),
			}
			gr.mu.Lock()
			ms := slices.Clone(gr.members)
			s.Completed = int64(gr.rec.Completions)
			s.Accounted = len(gr.accounted)
			gr.mu.Unlock()
			s.Members = len(ms)
			var evictions int
			for _, m := range ms {
				evictions += m.obs.evictions()
				if m.sr != nil {
					b := m.sr.Stats().Budget
					s.Budget += b.Capacity
					s.InUse += b.InUse
					s.Waiting += b.Waiting
					s.WaitOldestMS = max(s.WaitOldestMS, float64(b.OldestWait)/1e6)
				}
			}
			gr.mu.Lock()
			gr.rec.Series = append(gr.rec.Series, s)
			gr.mu.Unlock()
			if gr.o.OnProgress != nil && now.Sub(lastReport) >= time.Second {
				p := Progress{
					Group: gr.name, T: now.Sub(gr.start), Producing: gr.published.Load() < int64(len(gr.st.Messages)),
					Published: int(gr.published.Load()), Total: len(gr.st.Messages), Accounted: s.Accounted,
					VerticesPerS: float64(s.Vertices-lastVertices) / now.Sub(lastReport).Seconds(),
					Budget:       s.Budget, Inflight: s.Inflight, Lag: s.Lag, Shed: int(s.Shed),
					Redeliveries: int(s.Redeliveries), Duplicates: int(s.Duplicates), Evictions: evictions, Members: s.Members,
				}
				gr.mu.Lock()
				p.Completed = gr.rec.Unique
				gr.mu.Unlock()
				p.Fill = -1
				if s.Budget > 0 {
					p.Fill = float64(s.InUse) / float64(s.Budget)
				}
				gr.o.OnProgress(p)
				lastReport, lastVertices = now, s.Vertices
			}
		}
	}
}

// readLag reads the groups' lag every LagEvery.
func (gr *groupRun) readLag(ctx context.Context) {
	tick := time.NewTicker(gr.o.LagEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if l, err := gr.env.lag(gr.name); err == nil {
				gr.lag.Store(l)
			}
		}
	}
}
