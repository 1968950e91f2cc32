package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twpayne/go-geom"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/internal/serialtest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// The heavy burst and rebalance scenario: the core promise, in Watermill's
// terms. A consumer group on a 12-partition topic receives a burst of heavy
// multipolygons (real county polygons assembled to tens of thousands of
// vertices) mixed with pings; a second member joins mid-burst and forces a
// rebalance under a short rebalance timeout.
//
// Costs are measured, not guessed: at the start the test times the
// reference handler on a heavy message on this machine (with -race if it is
// on) and picks the number of work passes so that one heavy message takes a
// third of the rebalance timeout. Twelve of them at once (one per
// partition, which is what watermill-kafka delivers) need twice the
// timeout on two cores; the budget, sized to drain within half the
// timeout, admits about three.
//
// Three stacks run the same scenario on the same machine:
//
//   - control: message-count concurrency only (stock watermill-kafka): a
//     budget the whole burst fits in, so nothing ever waits, and no
//     revocation-awareness. Must fail: late rebalance, eviction or
//     duplicates.
//   - budget-only: the vertex budget without revocation-awareness. Its
//     outcome is recorded (docs/kafka.md); it fails the same way.
//   - spillway: budget plus revocation-aware admission. The rebalance
//     completes within the timeout, no member is evicted, every message is
//     processed exactly once.

const (
	burstTopic       = "burst"
	burstPartitions  = 12
	rebalanceTimeout = 4 * time.Second
	heavyVertices    = 20_000
	heartbeat        = 250 * time.Millisecond
	// heavyTarget is how long one heavy message should take alone.
	heavyTarget = rebalanceTimeout / 4
)

type scenarioMode int

const (
	modeControl scenarioMode = iota
	modeBudgetOnly
	modeSpillway
)

func (m scenarioMode) String() string {
	return [...]string{"control", "budget-only", "spillway"}[m]
}

// withoutRevocation makes r's admission blind to lost deliveries, as stock
// watermill-kafka is, for the control stacks: a message waiting for budget
// never steps aside when its session ends, and an ack that arrives after
// its session ended is dropped, since the session tracker never hears that
// the handler completed. Call it after adding the handlers, before Run.
func (r *Router) withoutRevocation() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.trackers.Load(); m != nil {
		for name, tr := range *m {
			r.setTracker(name, blindTracker{tr})
		}
	}
}

// blindTracker is a delivery tracker that neither revokes nor hears of
// completions; sessions are still tracked and redeliveries still told.
type blindTracker struct{ deliveryTracker }

func (blindTracker) Revoked(*message.Message) <-chan struct{} { return nil }

func (blindTracker) Completed(*message.Message) {}

// calibration is what the machine can do, measured.
type calibration struct {
	passes    int           // work passes per message
	heavyTime time.Duration // one heavy message, one goroutine
	rate      float64       // vertices/s with two goroutines
	budget    int64         // rate × rebalanceTimeout × 0.5 (the default headroom), at least 1
}

// calibrate measures the machine now. Other work on the machine changes the
// numbers, so every scenario calibrates right before it runs.
func calibrate() calibration {
	var c calibration
	g := heavyGeometryNoT(heavyVertices)
	one := timeWork(g, 1, 3)
	c.passes = max(1, int(math.Round(float64(heavyTarget)/float64(one))))
	c.heavyTime = timeWork(g, c.passes, 1)
	// Throughput of the whole consumer: two heavy messages at once.
	start := time.Now()
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(g, c.passes, nil)
		}()
	}
	wg.Wait()
	c.rate = 2 * heavyVertices / time.Since(start).Seconds()
	c.budget = max(1, int64(c.rate*rebalanceTimeout.Seconds()*0.5))
	return c
}

func heavyGeometryNoT(n int) *geom.MultiPolygon {
	return heavyGeometry(panicTB{}, 0, n)
}

// panicTB is enough of testing.TB for helpers used outside a test.
type panicTB struct{ testing.TB }

func (panicTB) Helper()                      {}
func (panicTB) Fatal(args ...any)            { panic(fmt.Sprint(args...)) }
func (panicTB) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }

// burstMessage is one message of the burst.
type burstMessage struct {
	uuid    string
	key     string
	heavy   bool
	payload []byte
}

// burst builds, for every partition: heavy, ping, ping, heavy (even
// partitions only), ping. Keys are chosen so that Sarama's hash partitioner
// puts each partition's messages where intended.
func burst(t *testing.T) []burstMessage {
	keys := partitionKeys(t)
	var out []burstMessage
	heavies := 0
	add := func(p int, heavy bool) {
		m := burstMessage{uuid: fmt.Sprintf("p%02d-%d", p, len(out)), key: keys[p], heavy: heavy}
		if heavy {
			m.payload = wkbPayload(t, heavyGeometry(t, heavies*211, heavyVertices))
			heavies++
		} else {
			m.payload = pingPayload(len(out))
		}
		out = append(out, m)
	}
	for p := 0; p < burstPartitions; p++ {
		add(p, true)
		add(p, false)
		add(p, false)
		if p%2 == 0 {
			add(p, true)
		}
		add(p, false)
	}
	return out
}

func partitionKeys(t *testing.T) []string {
	keys := make([]string, burstPartitions)
	found := 0
	part := sarama.NewHashPartitioner(burstTopic)
	for i := 0; found < burstPartitions; i++ {
		k := "entity-" + strconv.Itoa(i)
		p, err := part.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(k)}, burstPartitions)
		if err != nil {
			t.Fatal(err)
		}
		if keys[p] == "" {
			keys[p] = k
			found++
		}
	}
	return keys
}

// scenarioResult is what one run of the scenario did.
type scenarioResult struct {
	mode           scenarioMode
	rebalance      time.Duration // second member started -> its first session set up
	noticed        time.Duration // second member started -> first member's session ended
	released       time.Duration // second member started -> first member released its claims
	evictions      uint64        // member came back under a new member id
	commitErrors   int           // Sarama errors about unknown member / generation
	completed      int           // handler runs that finished
	unique         int           // distinct messages finished
	duplicates     int           // messages finished more than once
	abandoned      int           // runs stopped at teardown
	revocations    uint64
	lateMarks      uint64
	sessions       int // consumer-group sessions of both members
	peakInUse      int64
	capacity       int64
	elapsed        time.Duration
	firstMemberRun map[string]int
}

func (r scenarioResult) failed() bool {
	return r.evictions > 0 || r.duplicates > 0 || r.commitErrors > 0 || r.rebalance >= rebalanceTimeout
}

func (r scenarioResult) String() string {
	return fmt.Sprintf("%-11s rebalance %6s (noticed %6s, released %6s) evictions %d commit-errors %d "+
		"completed %d unique %d duplicates %d abandoned %d revocations %d late-marks %d sessions %d peak %d/%d elapsed %s",
		r.mode, r.rebalance.Round(time.Millisecond), r.noticed.Round(time.Millisecond), r.released.Round(time.Millisecond),
		r.evictions, r.commitErrors, r.completed, r.unique, r.duplicates, r.abandoned, r.revocations, r.lateMarks, r.sessions,
		r.peakInUse, r.capacity, r.elapsed.Round(100*time.Millisecond))
}

var errAbandoned = errors.New("abandoned at teardown")

// member is one consumer of the group: a router and its bookkeeping.
type member struct {
	name     string
	r        *Router
	logger   *recordingLogger
	sessions *sessionLog // of the burst topic's group
	runErr   chan error
}

// runScenario runs the scenario once with the stack of mode, consuming
// with kafka.consumer consumer (partition or key).
func runScenario(t *testing.T, mode scenarioMode, consumer string, msgs []burstMessage) scenarioResult {
	cal := calibrate()
	for try := 1; cal.heavyTime > rebalanceTimeout/2 && try < 3; try++ {
		// The machine got busier between counting the passes and timing
		// them (CI runs other packages' tests beside this one): count
		// again before calling the calibration failed.
		t.Logf("calibration %d: one heavy message took %s; calibrating again", try, cal.heavyTime.Round(time.Millisecond))
		cal = calibrate()
	}
	t.Logf("%s (consumer %s) calibration: %d passes, heavy message %s alone, %.0f vertices/s on two goroutines, budget %d vertices (%.1f heavy messages), rebalance timeout %s",
		mode, consumer, cal.passes, cal.heavyTime.Round(time.Millisecond), cal.rate, cal.budget, float64(cal.budget)/heavyVertices, rebalanceTimeout)
	if cal.heavyTime > rebalanceTimeout/2 {
		t.Fatalf("one heavy message takes %s, more than half the rebalance timeout: calibration failed", cal.heavyTime)
	}
	res := scenarioResult{mode: mode, capacity: cal.budget}
	began := time.Now()

	cluster := kafkatest.Start(t, burstPartitions, burstTopic)

	cfg := Config{Broker: brokerKafka, CloseTimeout: 15 * time.Second}
	cfg.Budget.Vertices = cal.budget
	if mode == modeControl {
		// No admission control: the whole burst fits, nothing waits.
		cfg.Budget.Vertices = int64(len(msgs)) * heavyVertices
		res.capacity = cfg.Budget.Vertices
	}
	cfg.Kafka.Brokers = cluster.Brokers()
	cfg.Kafka.Version = "2.3.0"    // kfake's limit
	cfg.Kafka.Partitioner = "hash" // partitionKeys'
	cfg.Kafka.ConsumerGroup = "rebalance-" + mode.String() + "-" + consumer
	cfg.Kafka.Consumer = consumer
	cfg.Kafka.Partitions = burstPartitions
	cfg.Kafka.RebalanceTimeout = rebalanceTimeout
	cfg.Kafka.HeartbeatInterval = heartbeat

	var (
		mu        sync.Mutex
		completed = map[string]int{}
		byMember  = map[string]int{}
		started   = map[string]int{}
		abandoned int
		stopping  atomic.Bool
		allDone   = make(chan struct{})
		// released opens once every partition has delivered its first
		// message: under load Sarama's delivery of the later partitions
		// would otherwise trail the CPU-bound handlers of the first ones.
		released = make(chan struct{})
		dupSeen  = make(chan struct{})
	)
	handler := func(memberName string) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			g, err := cost.Decode(msg.Payload)
			if err != nil {
				return err
			}
			mu.Lock()
			started[memberName]++
			mu.Unlock()
			<-released
			if _, ok := work(g, cal.passes, stopping.Load); !ok {
				mu.Lock()
				abandoned++
				mu.Unlock()
				return errAbandoned
			}
			mu.Lock()
			defer mu.Unlock()
			completed[msg.UUID]++
			byMember[memberName]++
			if completed[msg.UUID] == 2 {
				select {
				case <-dupSeen:
				default:
					close(dupSeen)
				}
			}
			if len(completed) == len(msgs) {
				select {
				case <-allDone:
				default:
					close(allDone)
				}
			}
			return nil
		}
	}

	newMember := func(name string) *member {
		m := &member{name: name, logger: newRecordingLogger(t), sessions: newSessionLog(burstTopic), runErr: make(chan error, 1)}
		r, err := New(cfg, m.logger, WithKafka(kafkabroker.WithTracer(m.sessions)))
		if err != nil {
			t.Fatal(err)
		}
		m.r = r
		if _, err := r.AddConsumerHandler("geo", burstTopic, handler(name)); err != nil {
			t.Fatal(err)
		}
		if mode != modeSpillway {
			r.withoutRevocation()
		}
		return m
	}

	a := newMember("a")
	for _, bm := range msgs {
		msg := message.NewMessage(bm.uuid, bm.payload)
		msg.Metadata.Set("entity_id", bm.key)
		if err := a.r.Publisher().Publish(burstTopic, msg); err != nil {
			t.Fatal(err)
		}
	}

	go func() { a.runErr <- a.r.Run(context.Background()) }()
	// Mid-burst: the first member has been working for a while, every
	// partition has delivered its heavy message.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := started["a"]
		mu.Unlock()
		if n >= 1 && a.r.settling.inFlight() >= burstPartitions {
			close(released)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: first member never got going (started %d, in flight %d)", mode, n, a.r.settling.inFlight())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)

	b := newMember("b")
	joined := time.Now()
	go func() { b.runErr <- b.r.Run(context.Background()) }()

	// Wait for the outcome: everything processed, or (for the stacks that
	// are expected to fail) a clear failure.
	// SPILLWAY_REBALANCE_OBSERVE=1 lets the failing stacks run on (up to
	// the limit) to see everything they do; docs/kafka.md quotes it.
	observe := os.Getenv("SPILLWAY_REBALANCE_OBSERVE") != ""
	limit := time.After(90 * time.Second)
	if observe {
		limit = time.After(150 * time.Second)
	}
	evicted := func() bool { return a.r.Stats().Evictions+b.r.Stats().Evictions > 0 }
	stopOnDup := dupSeen
	if mode == modeSpillway || observe {
		stopOnDup = nil // wait for everything
	}
wait:
	for {
		select {
		case <-allDone:
			break wait
		case <-stopOnDup:
			break wait
		case <-limit:
			break wait
		case <-time.After(50 * time.Millisecond):
			if mode != modeSpillway && !observe && evicted() {
				break wait
			}
		}
	}

	// Measure before teardown.
	bEvents := b.sessions.sessions()
	aEvents := a.sessions.sessions()
	if len(bEvents) > 0 {
		res.rebalance = bEvents[0].started.Sub(joined)
	} else {
		res.rebalance = time.Since(joined) // never completed while we watched
	}
	if len(aEvents) > 0 {
		if e := aEvents[0].ended; !e.IsZero() {
			res.noticed = e.Sub(joined)
		}
		if r := aEvents[0].released; !r.IsZero() {
			res.released = r.Sub(joined)
		}
	}
	res.sessions = len(aEvents) + len(bEvents)
	for _, m := range []*member{a, b} {
		st := m.r.Stats()
		res.evictions += st.Evictions
		res.revocations += st.Revocations
		res.lateMarks += st.LateMarks
		res.peakInUse = max(res.peakInUse, st.Budget.PeakInUse)
		for _, e := range m.logger.Errors() {
			l := strings.ToLower(e)
			if strings.Contains(l, "unknown member") || strings.Contains(l, "illegal generation") ||
				strings.Contains(l, "not a current member") {
				res.commitErrors++
			}
		}
	}

	stopping.Store(true)
	var wg sync.WaitGroup
	for _, m := range []*member{b, a} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.r.Close(); err != nil && mode == modeSpillway {
				t.Errorf("%s: close %s: %v", mode, m.name, err)
			}
			<-m.runErr
		}()
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	for _, n := range completed {
		res.completed += n
		if n > 1 {
			res.duplicates++
		}
	}
	res.unique = len(completed)
	res.abandoned = abandoned
	res.firstMemberRun = map[string]int{"a": byMember["a"], "b": byMember["b"]}
	res.elapsed = time.Since(began)
	return res
}

func TestHeavyBurstRebalance(t *testing.T) {
	if testing.Short() {
		t.Skip("heavy scenario: about a minute on two cores")
	}
	serialtest.Exclusive(t) // not at the same time as the demo's scenario
	msgs := burst(t)

	results := map[scenarioMode]scenarioResult{}
	for _, mode := range []scenarioMode{modeSpillway, modeControl, modeBudgetOnly} {
		res := runScenario(t, mode, kafkabroker.ConsumerPartition, msgs)
		results[mode] = res
		t.Logf("%v", res)
	}

	sp := results[modeSpillway]
	checkSpillwayScenario(t, sp, len(msgs))

	if ctl := results[modeControl]; !ctl.failed() {
		t.Errorf("control (nothing waits for budget) did not fail: the scenario does not prove the mechanism: %v", ctl)
	}
	if bo := results[modeBudgetOnly]; !bo.failed() {
		t.Errorf("budget-only did not fail; update docs/kafka.md: %v", bo)
	}
}

// TestHeavyBurstRebalanceKey is the scenario's spillway stack with
// kafka.consumer key: the same promise (every message once, no eviction,
// the rebalance inside its timeout) when many messages of a partition are
// in flight. The burst puts one key on each partition, so the key mode
// hands over what partition mode does; the control stacks, which fail
// the same way in either mode, are left to TestHeavyBurstRebalance.
func TestHeavyBurstRebalanceKey(t *testing.T) {
	if testing.Short() {
		t.Skip("heavy scenario: about half a minute on two cores")
	}
	serialtest.Exclusive(t) // not at the same time as the demo's scenario
	msgs := burst(t)
	res := runScenario(t, modeSpillway, kafkabroker.ConsumerKey, msgs)
	t.Logf("%v", res)
	checkSpillwayScenario(t, res, len(msgs))
}

// checkSpillwayScenario checks the spillway stack's promise on one run of
// the scenario of n messages.
func checkSpillwayScenario(t *testing.T, sp scenarioResult, n int) {
	t.Helper()
	if sp.unique != n {
		t.Errorf("spillway: %d of %d messages processed", sp.unique, n)
	}
	if sp.duplicates != 0 {
		t.Errorf("spillway: %d messages processed twice", sp.duplicates)
	}
	if sp.evictions != 0 || sp.commitErrors != 0 {
		t.Errorf("spillway: member evicted (evictions %d, commit errors %d)", sp.evictions, sp.commitErrors)
	}
	if sp.rebalance >= rebalanceTimeout {
		t.Errorf("spillway: rebalance took %s, timeout %s", sp.rebalance, rebalanceTimeout)
	}
	if sp.revocations == 0 {
		t.Errorf("spillway: no waiting message stepped aside: the scenario did not exercise revocation")
	}
	if sp.peakInUse > sp.capacity {
		t.Errorf("spillway: budget peak %d over capacity %d", sp.peakInUse, sp.capacity)
	}
}
