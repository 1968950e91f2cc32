package router

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/telemetry"
)

// TestKeyRebalanceMidBurst is the heavy-burst rebalance (rebalance_test.go)
// for kafka.consumer key, with handlers that sleep in proportion to the
// vertices instead of burning CPU, so it runs alongside other tests: four
// partitions carry a burst of heavy multipolygons and pings over many keys;
// the budget admits a few heavies at once, so at any time many delivered
// messages of each partition wait for budget. A second member joins
// mid-burst under a short rebalance timeout. The messages waiting for
// budget step aside, admitted work finishes and is committed, what
// completed beyond the watermark is skipped by the next owner: every
// message is processed exactly once, in order per key, nobody is evicted,
// and the rebalance completes inside the timeout.
func TestKeyRebalanceMidBurst(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, leakOptions...) })
	const (
		topic     = "key-burst"
		timeout   = 4 * time.Second
		perVertex = 100 * time.Microsecond
		n         = 600
		keys      = 40
	)
	broker := kafkatest.Start(t, 4, topic)
	cfg := Config{Broker: brokerKafka, CloseTimeout: 15 * time.Second}
	cfg.Budget.Vertices = 5_000 // two heavies (2,000+ vertices, 0.2 s) or many pings
	cfg.Kafka.Brokers = broker.Brokers()
	cfg.Kafka.Version = "2.3.0"
	cfg.Kafka.ConsumerGroup = "key-burst"
	cfg.Kafka.Partitions = 4
	cfg.Kafka.RebalanceTimeout = timeout
	cfg.Kafka.HeartbeatInterval = 250 * time.Millisecond
	cfg.Kafka.Consumer = kafkabroker.ConsumerKey
	cfg.Kafka.WindowMessages = 32

	heavy := wkbPayload(t, heavyGeometry(t, 0, 2_000))
	var (
		mu        sync.Mutex
		completed = map[string]int{}
		order     = map[string][]int{}
		inFlight  = map[string]int{}
		overlap   int
		total     atomic.Int64
	)
	handler := func(msg *message.Message) error {
		key := msg.Metadata.Get("entity_id")
		seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
		mu.Lock()
		if inFlight[key]++; inFlight[key] > 1 {
			overlap++
		}
		mu.Unlock()
		v, _ := strconv.Atoi(msg.Metadata.Get(cost.MetadataKey))
		time.Sleep(time.Duration(v) * perVertex)
		mu.Lock()
		inFlight[key]--
		completed[msg.UUID]++
		order[key] = append(order[key], seq)
		mu.Unlock()
		total.Add(1)
		return nil
	}
	type member struct {
		r        *Router
		logger   *recordingLogger
		sessions *sessionLog
		runErr   chan error
	}
	join := func() *member {
		m := &member{logger: newRecordingLogger(t), sessions: newSessionLog(topic), runErr: make(chan error, 1)}
		r, err := New(cfg, m.logger, WithKafka(kafkabroker.WithTracer(m.sessions)))
		if err != nil {
			t.Fatal(err)
		}
		m.r = r
		if _, err := r.AddConsumerHandler("geo", topic, handler); err != nil {
			t.Fatal(err)
		}
		return m
	}
	a := join()
	for i := range n {
		payload := pingPayload(i)
		if i%10 == 0 {
			payload = heavy
		}
		msg := message.NewMessage(fmt.Sprintf("m%04d", i), payload)
		msg.Metadata.Set("entity_id", "e"+strconv.Itoa(i%keys))
		msg.Metadata.Set("seq", strconv.Itoa(i/keys))
		if err := a.r.Publisher().Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
	}
	go func() { a.runErr <- a.r.Run(context.Background()) }()
	waitUntil := func(d time.Duration, cond func() bool, what string) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (%d of %d processed)", what, total.Load(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitUntil(60*time.Second, func() bool { return total.Load() >= n/4 }, "a quarter of the burst")
	b := join()
	joined := time.Now()
	go func() { b.runErr <- b.r.Run(context.Background()) }()
	waitUntil(90*time.Second, func() bool { return total.Load() >= n }, "the whole burst")
	time.Sleep(time.Second) // a duplicate, if any, shows up now

	var rebalance time.Duration
	if ev := b.sessions.sessions(); len(ev) > 0 {
		rebalance = ev[0].started.Sub(joined)
	}
	sa, sb := a.r.Stats(), b.r.Stats()
	for _, m := range []*member{b, a} {
		if err := m.r.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		<-m.runErr
	}

	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, k := range completed {
		if k > 1 {
			dups++
		}
	}
	t.Logf("rebalance %s, duplicates %d, revocations %d, late marks %d, evictions %d, peak %d/%d",
		rebalance.Round(time.Millisecond), dups, sa.Revocations+sb.Revocations, sa.LateMarks+sb.LateMarks,
		sa.Evictions+sb.Evictions, max(sa.Budget.PeakInUse, sb.Budget.PeakInUse), cfg.Budget.Vertices)
	if len(completed) != n || dups != 0 {
		t.Errorf("%d of %d messages processed, %d of them more than once", len(completed), n, dups)
	}
	if ev := sa.Evictions + sb.Evictions; ev != 0 {
		t.Errorf("%d evictions", ev)
	}
	if rebalance <= 0 || rebalance >= timeout {
		t.Errorf("rebalance took %s, timeout %s", rebalance, timeout)
	}
	if sa.Revocations == 0 {
		t.Error("no waiting message stepped aside: the test did not exercise revocation")
	}
	if overlap != 0 {
		t.Errorf("%d times two messages of one key were in flight together", overlap)
	}
	for k, seqs := range order {
		for i, s := range seqs {
			if s != i {
				t.Errorf("key %s processed in order %v", k, seqs)
				break
			}
		}
	}
}

// TestKeyWindowGauges: with kafka.consumer key the router exports the
// window's fill per partition, with the topic, consumer group and
// partition as attributes (as the lag gauge).
func TestKeyWindowGauges(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, leakOptions...) })
	const (
		topic  = "key-gauges"
		window = 4
	)
	broker := kafkatest.Start(t, 2, topic)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	cfg := Config{Broker: brokerKafka, CloseTimeout: 15 * time.Second}
	cfg.Kafka.Brokers = broker.Brokers()
	cfg.Kafka.Version = "2.3.0"
	cfg.Kafka.ConsumerGroup = "gauges"
	cfg.Kafka.Partitions = 2
	cfg.Kafka.Consumer = kafkabroker.ConsumerKey
	cfg.Kafka.WindowMessages = window
	r, err := New(cfg, nil, WithTelemetry(telemetry.WithMeterProvider(mp)))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var held atomic.Int64
	if _, err := r.AddConsumerHandler("h", topic, func(*message.Message) error {
		held.Add(1)
		<-release
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		publishCosted(t, r, topic, "m"+strconv.Itoa(i), 1)
	}
	errc := runRouter(t, r)
	deadline := time.Now().Add(30 * time.Second)
	for held.Load() < 2*window && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := series(t, reader)
	close(release)
	closeRouter(t, r, errc)

	for p := range 2 {
		at := "group=gauges.h partition=" + strconv.Itoa(p) + " topic=" + topic + " "
		if n := got["spillway.kafka.window.records"][at]; n != window {
			t.Errorf("spillway.kafka.window.records{%s} = %v, want %d (series %v)", at, n, window, got["spillway.kafka.window.records"])
		}
		if n := got["spillway.kafka.window.bytes"][at]; n <= 0 {
			t.Errorf("spillway.kafka.window.bytes{%s} = %v, want > 0 (series %v)", at, n, got["spillway.kafka.window.bytes"])
		}
		// The rest of the partition's records wait in the read-ahead;
		// how many have been fetched by now is Sarama's affair.
		if _, ok := got["spillway.kafka.readahead.records"][at]; !ok {
			t.Errorf("no spillway.kafka.readahead.records{%s} (series %v)", at, got["spillway.kafka.readahead.records"])
		}
		if _, ok := got["spillway.kafka.readahead.bytes"][at]; !ok {
			t.Errorf("no spillway.kafka.readahead.bytes{%s} (series %v)", at, got["spillway.kafka.readahead.bytes"])
		}
	}
}

// keyRetryLog records, for TestKeyRetryGateRebalanceKeepsOrder, each
// message's handler runs and the retry gate's deferrals of messages whose
// handler had never run.
type keyRetryLog struct {
	mu     sync.Mutex
	runs   map[string]int
	unrun  []string // "uuid (cause)" deferred before its handler ever ran
	events int
}

func (l *keyRetryLog) OnRetryOutcome(e retrygate.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events++
	if e.Outcome == retrygate.Deferred && e.Cause != "revoked" && l.runs[e.Message.UUID] == 0 {
		l.unrun = append(l.unrun, e.Message.UUID+" ("+e.Cause+")")
	}
}

// TestKeyRetryGateRebalanceKeepsOrder: kafka.consumer key with the retry
// gate on (its defaults: deferrals nack) and the budget saturated through
// a rebalance. The messages handed over and waiting for budget step aside
// when a second member joins, and come back to this router when it
// leaves, while the budget is still saturated: they never ran, so the
// gate lets them wait for budget as fresh work rather than deferring them
// as redeliveries. Some messages fail their first run and are deferred or
// retried. Every message completes once, and for every key the handler
// sees its messages one at a time, in order.
func TestKeyRetryGateRebalanceKeepsOrder(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, leakOptions...) })
	const (
		topic = "key-retry"
		n     = 200
		keys  = 20
	)
	broker := kafkatest.Start(t, 2, topic)
	cfg := Config{Broker: brokerKafka, CloseTimeout: 15 * time.Second}
	cfg.Budget.Vertices = 100
	cfg.Kafka.Brokers = broker.Brokers()
	cfg.Kafka.Version = "2.3.0" // kfake's limit
	cfg.Kafka.ConsumerGroup = "key-retry"
	cfg.Kafka.Partitions = 2
	cfg.Kafka.Consumer = kafkabroker.ConsumerKey
	cfg.Kafka.WindowMessages = 16
	cfg.Kafka.RebalanceTimeout = 20 * time.Second
	cfg.Kafka.HeartbeatInterval = 100 * time.Millisecond
	cfg.Kafka.NackResendSleep = 10 * time.Millisecond
	cfg.Retry.MaxElapsedTime = 5 * time.Second
	log := &keyRetryLog{runs: map[string]int{}}
	r, err := New(cfg, nil, WithHooks(log))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		completed = map[string]int{}
		order     = map[string][]int{}
		inFlight  = map[string]int{}
		overlap   int
		total     atomic.Int64
	)
	if _, err := r.AddConsumerHandler("geo", topic, func(msg *message.Message) error {
		key := msg.Metadata.Get("entity_id")
		seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
		log.mu.Lock()
		log.runs[msg.UUID]++
		first := log.runs[msg.UUID] == 1
		log.mu.Unlock()
		mu.Lock()
		if inFlight[key]++; inFlight[key] > 1 {
			overlap++
		}
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		inFlight[key]--
		if first && seq%3 == 1 {
			return fmt.Errorf("first run of %s fails", msg.UUID)
		}
		completed[msg.UUID]++
		order[key] = append(order[key], seq)
		total.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Saturate the budget through the rebalance: every message handed
	// over waits.
	hold, err := r.budget.Acquire(context.Background(), cfg.Budget.Vertices)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		msg := message.NewMessage(fmt.Sprintf("m%03d", i), pingPayload(i))
		msg.Metadata.Set(cost.MetadataKey, "10")
		msg.Metadata.Set("entity_id", "e"+strconv.Itoa(i%keys))
		msg.Metadata.Set("seq", strconv.Itoa(i/keys))
		if err := r.Publisher().Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
	}
	errc := runRouter(t, r)
	waitFor(t, "a message of every key to wait for budget", func() bool { return r.budget.Stats().Waiting == keys })

	// A second member joins: the waiters step aside. It leaves again, so
	// that this router owns every partition and gets them back.
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_3_0_0
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Group.Heartbeat.Interval = 100 * time.Millisecond
	sc.Consumer.Group.Rebalance.Timeout = 20 * time.Second
	group, err := sarama.NewConsumerGroup(broker.Brokers(), r.back.group("geo"), sc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	joined := make(chan struct{})
	go func() {
		defer close(joined)
		_ = group.Consume(ctx, []string{topic}, idleMember{})
	}()
	waitFor(t, "the waiters to step aside", func() bool { return r.Stats().Revocations >= keys/2 })
	cancel()
	<-joined
	_ = group.Close()
	waitFor(t, "every key's first message back, waiting or deferred", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return r.budget.Stats().Waiting == keys || len(log.unrun) > 0
	})
	time.Sleep(500 * time.Millisecond) // a deferral on arrival, if any, shows up now
	hold.Release()
	waitFor(t, "every message to complete", func() bool { return total.Load() >= n })
	time.Sleep(500 * time.Millisecond) // a duplicate, if any, shows up now
	closeRouter(t, r, errc)

	mu.Lock()
	defer mu.Unlock()
	log.mu.Lock()
	defer log.mu.Unlock()
	t.Logf("revocations %d, retry outcomes %d", r.Stats().Revocations, log.events)
	if len(log.unrun) > 0 {
		t.Errorf("the retry gate deferred %d messages whose handler never ran: %v", len(log.unrun), log.unrun)
	}
	dups := 0
	for _, k := range completed {
		if k > 1 {
			dups++
		}
	}
	if len(completed) != n || dups != 0 {
		t.Errorf("%d of %d messages completed, %d of them more than once", len(completed), n, dups)
	}
	if overlap != 0 {
		t.Errorf("%d times two messages of one key were in flight together", overlap)
	}
	for k, seqs := range order {
		for i, s := range seqs {
			if s != i {
				t.Errorf("key %s completed in order %v", k, seqs)
				break
			}
		}
	}
}
