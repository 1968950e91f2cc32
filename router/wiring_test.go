package router

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/shedding"
	"github.com/spillway-go/spillway/sizing"
)

// Tests of the wiring of shedding, the retry gate and the auto-sizer into
// the router: configuration in, behaviour of the real router out.

// startSignalLoop starts os/signal's process-wide watcher outside any
// synctest bubble. Router.Run subscribes to SIGINT and SIGTERM, and the
// watcher, started on first use and never stopped, must not belong to a
// bubble.
var startSignalLoop = sync.OnceFunc(func() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR2)
	signal.Stop(c)
})

// publishCosted publishes a message of the given vertex count, entity and
// region priority through the router's publisher.
func publishCosted(t *testing.T, r *Router, topic, uuid string, vertices int64, meta ...string) {
	t.Helper()
	msg := message.NewMessage(uuid, pingPayload(len(uuid)))
	msg.Metadata.Set(cost.MetadataKey, strconv.FormatInt(vertices, 10))
	msg.Metadata.Set("entity_id", uuid)
	for i := 0; i+1 < len(meta); i += 2 {
		msg.Metadata.Set(meta[i], meta[i+1])
	}
	if err := r.Publisher().Publish(topic, msg); err != nil {
		t.Fatal(err)
	}
}

// runRouter runs r until the test ends and returns Run's error channel.
func runRouter(t *testing.T, r *Router) <-chan error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	<-r.Running()
	return errc
}

func closeRouter(t *testing.T, r *Router, errc <-chan error) {
	t.Helper()
	if err := r.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-errc; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestStackLayers: the stack's slots and the budget slot's parts, with
// nothing optional configured and with everything.
func TestStackLayers(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	plain, err := New(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if got := plain.stack().layers(); !reflect.DeepEqual(got, []string{"tracing", "metrics", "retry-gate", "budget"}) {
		t.Errorf("default layers = %v", got)
	}
	bare := Config{}
	bare.Telemetry.Disabled = true
	bare.Retry.Disabled = true
	quiet, err := New(bare, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close()
	if got := quiet.stack().layers(); !reflect.DeepEqual(got, []string{"budget"}) {
		t.Errorf("layers without telemetry = %v", got)
	}
	if quiet.tracing != nil || quiet.metrics != nil || quiet.lagSampler != nil {
		t.Error("telemetry built while disabled")
	}
	if got := plain.stack().budgetLayers(); !reflect.DeepEqual(got, []string{"shutdown-gate", "admission", "admitted"}) {
		t.Errorf("default budget parts = %v", got)
	}
	if plain.policy != nil || plain.retry == nil || plain.sizer != nil {
		t.Error("optional layers built without configuration, or the retry gate missing")
	}
	if quiet.retry != nil {
		t.Error("retry gate built while disabled")
	}
	if got := quiet.stack().budgetLayers(); !reflect.DeepEqual(got, []string{"shutdown-gate", "admission", "admitted", "malformed"}) {
		t.Errorf("budget parts with retry.disabled = %v", got)
	}
	if st := plain.Stats(); st.Shedding != nil || st.Retry == nil || st.AutoSize != nil {
		t.Errorf("stats of absent layers: %+v", st)
	}

	all := Config{}
	all.Shedding.Topics = []string{"positions"}
	all.Budget.AutoSize = AutoSizeConfig{Enabled: true, Config: sizing.Config{Deadline: 10 * time.Second, Ceiling: 1_000_000}}
	r, err := New(all, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s := r.stack()
	if got := s.layers(); !reflect.DeepEqual(got, []string{"tracing", "metrics", "shedding", "retry-gate", "budget"}) {
		t.Errorf("layers = %v, want tracing, metrics, shedding, retry-gate, budget", got)
	}
	want := []string{"shutdown-gate", "admission", "admitted", "shedding-admitted", "auto-sizer"}
	if got := s.budgetLayers(); !reflect.DeepEqual(got, want) {
		t.Errorf("budget parts = %v, want %v", got, want)
	}
	// Four slots, the budget's parts, each a middleware of its own, and
	// the settling layer outside them.
	if n := len(s.middlewares()); n != 1+4+len(want) {
		t.Errorf("%d middlewares, want %d", n, 1+4+len(want))
	}
	if r.policy == nil || r.retry == nil || r.sizer == nil {
		t.Error("accessor nil for a configured layer")
	}
	if st := r.Stats(); st.Shedding == nil || st.Retry == nil || st.AutoSize == nil {
		t.Errorf("stats missing: %+v", st)
	}
}

// TestStackOrderProbe runs one message through a router with every layer
// and looks from inside the handler: the retry gate ran outside (the
// attempt is numbered), the budget is held while the handler runs, and the
// auto-sizer counted the handler's work once it finished.
func TestStackOrderProbe(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := Config{CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = 1000
	cfg.Shedding.Topics = []string{"other"}
	cfg.Budget.AutoSize = AutoSizeConfig{Enabled: true, Config: sizing.Config{Deadline: 10 * time.Second, Ceiling: 1_000_000}}
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	type probe struct {
		attempt int
		inUse   int64
		handler string
	}
	got := make(chan probe, 1)
	if _, err := r.AddConsumerHandler("probe", "jobs", func(msg *message.Message) error {
		got <- probe{retrygate.AttemptFromCtx(msg.Context()), r.budget.Stats().InUse, message.HandlerNameFromCtx(msg.Context())}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "jobs", "m", 40)
	var p probe
	select {
	case p = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("message not handled")
	}
	if p.attempt != 1 || p.inUse != 40 || p.handler != "probe" {
		t.Errorf("inside the handler: %+v, want attempt 1, 40 vertices held, handler probe", p)
	}
	waitFor(t, "the gate to count the delivery", func() bool { return r.Stats().Retry.Handled == 1 })
	closeRouter(t, r, errc)
	if st := r.Stats(); st.Budget.InUse != 0 || st.Retry.Handled != 1 {
		t.Errorf("after close: %+v", st)
	}
}

// TestRetryHandlerNaming: the retry handler takes the name <name>.retry,
// and a handler whose retry name is taken is not added at all.
func TestRetryHandlerNaming(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := Config{}
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	nop := func(*message.Message) error { return nil }
	if _, err := r.AddConsumerHandler("a", "t", nop); err != nil {
		t.Fatal(err)
	}
	if r.RetryHandler("a") == nil || retryHandlerName("a") != "a.retry" {
		t.Fatal("no retry handler a.retry")
	}
	if r.topics["a.retry"] != "t.retry" {
		t.Errorf("a.retry consumes %q, want t.retry", r.topics["a.retry"])
	}
	if _, err := r.AddConsumerHandler("b.retry", "u", nop); err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddConsumerHandler("b", "v", nop); err == nil {
		t.Fatal("handler b added although b.retry is taken")
	}
	if _, ok := r.topics["b"]; ok {
		t.Error("handler b left reserved after a failed add")
	}
	if len(r.subs) != 4 { // a, a.retry, b.retry, b.retry.retry
		t.Errorf("%d subscribers, want 4", len(r.subs))
	}
}

// TestSheddingThroughRouter: a sheddable and a non-sheddable topic share a
// budget that admits one message at a time. Low-priority messages of the
// sheddable topic are dropped once the budget has been saturated for the
// window, on arrival and after a wait, and not before the window or after
// the pressure clears; the other topic loses nothing, whatever its
// metadata. With the retry gate on, a retry copy of a sheddable message is
// sheddable too (filed under its origin topic), and one of the other topic
// is not. Counts are exact: the clock is synctest's.
func TestSheddingThroughRouter(t *testing.T) {
	startSignalLoop()
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{CloseTimeout: 10 * time.Second}
		cfg.Budget.Vertices = 100
		cfg.Shedding.Config = shedding.Config{
			Topics:     []string{"positions"},
			AuditTopic: "positions.shed",
			Priority:   shedding.PriorityConfig{Window: 5 * time.Second},
		}
		sheds := &shedTally{}
		r, err := New(cfg, nil, WithHooks(sheds))
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu      sync.Mutex
			handled = map[string][]string{}
		)
		h := func(msg *message.Message) error {
			time.Sleep(time.Second)
			topic := message.SubscribeTopicFromCtx(msg.Context())
			mu.Lock()
			handled[topic] = append(handled[topic], msg.UUID)
			mu.Unlock()
			return nil
		}
		for _, topic := range []string{"positions", "parcels"} {
			if _, err := r.AddConsumerHandler(topic, topic, h); err != nil {
				t.Fatal(err)
			}
		}
		errc := runRouter(t, r)
		pub := func(topic, uuid string, priority int) {
			publishCosted(t, r, topic, uuid, 100, "region_priority", strconv.Itoa(priority))
		}
		shed := func() int { return sheds.topic("positions")["shed_priority"] }

		// t=0: a low-priority position is admitted at once and runs for
		// 1s; eight parcels, then two more low positions, queue behind it.
		pub("positions", "early-low", 0)
		synctest.Wait()
		for i := range 8 {
			pub("parcels", fmt.Sprintf("parcel-%d", i), 0) // priority 0: would be shed if the topic were sheddable
		}
		synctest.Wait()
		pub("positions", "queued-low-0", 0)
		pub("positions", "queued-low-1", 1)
		synctest.Wait()

		time.Sleep(4 * time.Second)
		if r.Stats().Shedding.Shedding || shed() != 0 {
			t.Fatalf("shedding before the window: in force %v, %d shed", r.Stats().Shedding.Shedding, shed())
		}
		time.Sleep(2 * time.Second) // t=6: saturated for 6s, window 5s
		if !r.Stats().Shedding.Shedding {
			t.Fatal("not shedding after 6s of saturation")
		}
		for i := range 3 {
			pub("positions", fmt.Sprintf("late-low-%d", i), 1)
			pub("positions", fmt.Sprintf("late-high-%d", i), 5)
		}
		// Retry copies, as the gate writes them.
		publishCosted(t, r, "positions.retry", "retried-low", 100, "region_priority", "0", retrygate.OriginTopicKey, "positions")
		publishCosted(t, r, "parcels.retry", "retried-parcel", 100, "region_priority", "0", retrygate.OriginTopicKey, "parcels")
		synctest.Wait()
		if got := shed(); got != 4 {
			t.Fatalf("%d shed on arrival after the window, want the 3 late low ones and the retried one", got)
		}

		// The parcels finish at t=9; the two queued lows are shed as they
		// are admitted, the highs and the retried parcel run until t=13
		// and the pressure clears.
		time.Sleep(8 * time.Second)
		synctest.Wait()
		if r.Stats().Shedding.Shedding {
			t.Fatal("still shedding with nothing waiting")
		}
		pub("positions", "after-low", 0)
		time.Sleep(2 * time.Second)
		synctest.Wait()

		mu.Lock()
		slices.Sort(handled["positions"])
		if want := []string{"after-low", "early-low", "late-high-0", "late-high-1", "late-high-2"}; !reflect.DeepEqual(handled["positions"], want) {
			t.Errorf("positions handled: %v, want %v", handled["positions"], want)
		}
		if n := len(handled["parcels"]); n != 8 {
			t.Errorf("parcels handled: %d of 8", n)
		}
		if got := handled["parcels.retry"]; !reflect.DeepEqual(got, []string{"retried-parcel"}) {
			t.Errorf("parcels.retry handled: %v", got)
		}
		if got := handled["positions.retry"]; len(got) != 0 {
			t.Errorf("positions.retry handled: %v", got)
		}
		mu.Unlock()
		if ts := sheds.topic("positions"); ts["shed_priority"] != 6 || len(ts) != 1 {
			t.Errorf("positions: %v, want 6 shed by priority", ts)
		}
		if ts := sheds.topic("parcels"); len(ts) != 0 {
			t.Errorf("non-sheddable topic shed: %v", ts)
		}

		// Every drop went to the audit topic first.
		ctx, cancel := context.WithCancel(context.Background())
		audit, err := r.back.(*memoryBackend).ch.Subscribe(ctx, "positions.shed")
		if err != nil {
			t.Fatal(err)
		}
		var dropped []string
		for len(dropped) < 6 {
			m := <-audit
			m.Ack()
			if m.Metadata.Get(shedding.MetadataReason) != "shed_priority" || m.Metadata.Get(shedding.MetadataTopic) != "positions" {
				t.Errorf("audit copy %s: %v", m.UUID, m.Metadata)
			}
			dropped = append(dropped, m.UUID)
		}
		cancel()
		slices.Sort(dropped)
		if want := []string{"late-low-0", "late-low-1", "late-low-2", "queued-low-0", "queued-low-1", "retried-low"}; !reflect.DeepEqual(dropped, want) {
			t.Errorf("audit copies: %v, want %v", dropped, want)
		}
		closeRouter(t, r, errc)
	})
}

var errTransient = errors.New("downstream blip")

// TestRetryThroughRouter, on every broker: a message fails while another
// one waits for the budget, so the gate finds the consumer saturated and
// defers it to the retry topic; the retry handler (same handler, same
// stack) consumes it and handles it exactly once. A permanent error goes
// to the dead-letter topic with Watermill's PoisonQueue metadata.
func TestRetryThroughRouter(t *testing.T) {
	for _, bc := range brokerCases {
		t.Run(bc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, leakOptions...)
			runRetry(t, bc)
		})
	}
}

func runRetry(t *testing.T, bc brokerCase) {
	cfg := bc.config(t)
	cfg.CloseTimeout = 10 * time.Second
	cfg.Budget.Vertices = 100 // one message at a time
	cfg.Retry.MaxInterval = time.Second
	if bc.partitioned {
		cfg.Shedding.Config = shedding.Config{Topics: []string{"positions"}, AuditTopic: "positions.shed"}
	}
	tally := &retryTally{}
	r, err := New(cfg, nil, WithHooks(tally))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	var (
		mu           sync.Mutex
		runs         = map[string]int{}
		successBy    string
		successTry   int
		flakyFailed  = make(chan struct{})
		flakyStarted = make(chan struct{})
		flakyDone    = make(chan struct{})
	)
	handler := func(msg *message.Message) error {
		mu.Lock()
		runs[msg.UUID]++
		n := runs[msg.UUID]
		mu.Unlock()
		switch msg.UUID {
		case "flaky":
			if n == 1 {
				close(flakyStarted)
				// Fail only once the filler waits behind us, so the gate
				// finds the budget saturated.
				deadline := time.Now().Add(20 * time.Second)
				for r.budget.Stats().Waiting != 1 && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				close(flakyFailed)
				return errTransient
			}
			mu.Lock()
			successBy, successTry = message.HandlerNameFromCtx(msg.Context()), retrygate.AttemptFromCtx(msg.Context())
			mu.Unlock()
			close(flakyDone)
		case "filler":
			time.Sleep(400 * time.Millisecond)
		case "poison":
			return retrygate.Permanent(errors.New("unreadable geometry"))
		}
		return nil
	}
	if _, err := r.AddConsumerHandler("jobs", "jobs", handler); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.back.(*kafkaBackend); ok {
		sc := sarama.NewConfig()
		sc.Version = sarama.V2_3_0_0
		admin, err := sarama.NewClusterAdmin(r.back.(*kafkaBackend).cluster.Brokers(), sc)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close()
		topics, err := admin.ListTopics()
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"jobs", "jobs.retry", "jobs.dead_letter", "positions.shed"} {
			if d, ok := topics[want]; !ok || d.NumPartitions != cfg.Kafka.Partitions {
				t.Errorf("topic %s not created with %d partitions: %+v", want, cfg.Kafka.Partitions, d)
			}
		}
	}
	errc := runRouter(t, r)

	key := func(p int32) string {
		if !bc.partitioned {
			return fmt.Sprintf("k%d", p)
		}
		return keyFor(t, "jobs", p, cfg.Kafka.Partitions)
	}
	publishCosted(t, r, "jobs", "flaky", 100, "entity_id", key(0))
	select {
	case <-flakyStarted:
	case <-time.After(30 * time.Second):
		t.Fatal("flaky message never delivered")
	}
	publishCosted(t, r, "jobs", "filler", 100, "entity_id", key(1))
	<-flakyFailed
	select {
	case <-flakyDone:
	case <-time.After(30 * time.Second):
		t.Fatalf("flaky message never handled after its deferral: %+v", r.Stats().Retry)
	}
	publishCosted(t, r, "jobs", "poison", 100, "entity_id", key(2))

	// The dead-letter copy, read with a subscriber of the router's broker.
	dlTopic := cfg.Retry.DeadLetterTopicFor("jobs")
	sub, _, err := r.back.subscriber("dead-letter-reader", dlTopic)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	dead, err := sub.Subscribe(ctx, dlTopic)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-dead:
		m.Ack()
		want := map[string]string{
			wmw.PoisonedTopicKey:         "jobs",
			wmw.PoisonedHandlerKey:       "jobs",
			wmw.ReasonForPoisonedKey:     "unreadable geometry",
			retrygate.DeadLetterCauseKey: "permanent",
			retrygate.OriginTopicKey:     "jobs",
			"spillway_attempt":           "1",
		}
		if m.UUID != "poison" {
			t.Errorf("dead letter %s, want poison", m.UUID)
		}
		for k, v := range want {
			if got := m.Metadata.Get(k); got != v {
				t.Errorf("dead letter %s = %q, want %q", k, got, v)
			}
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nothing on the dead-letter topic")
	}
	cancel()
	if err := sub.Close(); err != nil {
		t.Error(err)
	}

	time.Sleep(300 * time.Millisecond) // room for a duplicate to show up
	closeRouter(t, r, errc)

	mu.Lock()
	defer mu.Unlock()
	if runs["flaky"] != 2 || runs["filler"] != 1 || runs["poison"] != 1 {
		t.Errorf("runs = %v, want flaky 2 (failed, then handled once), filler 1, poison 1", runs)
	}
	jobs, retries := tally.topic("jobs"), tally.topic(cfg.Retry.RetryTopicFor("jobs"))
	if cfg.Kafka.Consumer == kafkabroker.ConsumerKey {
		// Key order: retry.defer is nack there, so the flaky message is
		// sent again in its place, deferred until the budget has room.
		if successBy != "jobs" || successTry != 2 {
			t.Errorf("flaky handled by %q at attempt %d, want jobs at attempt 2", successBy, successTry)
		}
		if jobs[retrygate.Deferred] < 1 || jobs[retrygate.DeadLettered] != 1 || jobs[retrygate.Handled] != 2 || len(retries) != 0 {
			t.Errorf("jobs: %v, retry topic %v; want flaky deferred and handled, 1 dead-lettered (poison), filler handled, nothing on the retry topic", jobs, retries)
		}
	} else {
		if successBy != retryHandlerName("jobs") || successTry != 2 {
			t.Errorf("flaky handled by %q at attempt %d, want jobs.retry at attempt 2", successBy, successTry)
		}
		if jobs[retrygate.Deferred] != 1 || jobs[retrygate.DeadLettered] != 1 || jobs[retrygate.Handled] != 1 || jobs[retrygate.Nacked] != 0 {
			t.Errorf("jobs: %v, want 1 deferred (flaky), 1 dead-lettered (poison), 1 handled (filler)", jobs)
		}
		if retries[retrygate.Handled] != 1 || retries[retrygate.DeadLettered] != 0 || retries[retrygate.Nacked] != 0 {
			t.Errorf("retry topic: %v, want flaky handled once", retries)
		}
	}
	t.Logf("%s: jobs %v; retry topic %v", bc.name, jobs, retries)
}

// shedTally is a hook (OnShed) that counts the drops by origin topic and
// reason.
type shedTally struct {
	mu sync.Mutex
	by map[string]map[string]int
}

func (t *shedTally) OnShed(_ *message.Message, topic, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by == nil {
		t.by = map[string]map[string]int{}
	}
	if t.by[topic] == nil {
		t.by[topic] = map[string]int{}
	}
	t.by[topic][reason]++
}

// topic returns a copy of topic's counts by reason.
func (t *shedTally) topic(topic string) map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.by[topic])
}

// retryTally is a hook (OnRetryOutcome) that counts the gate's outcomes by
// consumed topic.
type retryTally struct {
	mu sync.Mutex
	by map[string]map[retrygate.Outcome]int
}

func (t *retryTally) OnRetryOutcome(e retrygate.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by == nil {
		t.by = map[string]map[retrygate.Outcome]int{}
	}
	if t.by[e.Topic] == nil {
		t.by[e.Topic] = map[retrygate.Outcome]int{}
	}
	t.by[e.Topic][e.Outcome]++
}

// topic returns a copy of topic's counts.
func (t *retryTally) topic(topic string) map[retrygate.Outcome]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.by[topic])
}

// TestCloseCutsRetryBackoff: a message backing off in the retry gate holds
// no budget and does not hold up Close: its wait ends when the subscriber
// closes, and it is nacked (redelivered by the broker), not retried or
// dead-lettered.
func TestCloseCutsRetryBackoff(t *testing.T) {
	startSignalLoop()
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{CloseTimeout: 10 * time.Second}
		cfg.Retry.InitialInterval = 3 * time.Second
		cfg.Retry.MaxInterval = 3 * time.Second
		cfg.Retry.Jitter = spillway.Off
		r, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int64
		if _, err := r.AddConsumerHandler("h", "jobs", func(*message.Message) error {
			calls.Add(1)
			return errTransient
		}); err != nil {
			t.Fatal(err)
		}
		errc := runRouter(t, r)
		publishCosted(t, r, "jobs", "m", 10)
		synctest.Wait() // failed once, backing off for 3s
		if calls.Load() != 1 || r.budget.Stats().InUse != 0 {
			t.Fatalf("calls %d, in use %d", calls.Load(), r.budget.Stats().InUse)
		}
		start := time.Now()
		closeRouter(t, r, errc)
		if d := time.Since(start); d >= time.Second {
			t.Errorf("Close took %s: it waited for the backoff", d)
		}
		// GoChannel may hand the nacked message back once more before
		// its subscriber closes; the shutdown gate nacks that delivery
		// without running it.
		if c := r.Stats().Retry; calls.Load() != 1 || c.Nacked == 0 || c.Handled+c.Deferred+c.DeadLettered != 0 {
			t.Errorf("calls %d, counts %+v: want only nacks", calls.Load(), c)
		}
	})
}

// TestAutoSizeThroughRouter: the auto-sizer measures the handler's own
// work, not the wait for budget, and resizes the budget to the deadline
// bound. A message of unknown cost (unmeasured) first holds the whole
// budget for 5s while the measured stream queues behind it; the handler
// then does 100 vertices per 10ms, one at a time: 10 000 vertices/s, so
// the deadline bound is 10 000 × 2s × 0.5 = 10 000. Had the sizer timed
// the queue, its first window would read 5s of busy time for one message
// and shrink the budget to the floor.
func TestAutoSizeThroughRouter(t *testing.T) {
	startSignalLoop()
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{CloseTimeout: 10 * time.Second}
		cfg.Budget.Vertices = 1000
		cfg.Budget.AutoSize = AutoSizeConfig{Enabled: true, Config: sizing.Config{
			Deadline:   2 * time.Second,
			Floor:      100,
			Ceiling:    1_000_000,
			Window:     time.Second,
			Windows:    1,
			MinWindows: 1,
			// The handler below queues its calls on one simulated core,
			// so once the budget grows, a call's duration includes that
			// queue; the tail guard (tested on its own in cost) would
			// rightly cap the budget by it. This test is about what the
			// sizer measures, so the guard is off.
			TailShare: spillway.Off,
		}}
		type resize struct{ from, to int64 }
		var (
			resizeMu sync.Mutex
			resizes  []resize
		)
		r, err := New(cfg, nil, WithHooks(resizeFunc(func(from, to int64, _ sizing.Bounds) {
			resizeMu.Lock()
			resizes = append(resizes, resize{from, to})
			resizeMu.Unlock()
		})))
		if err != nil {
			t.Fatal(err)
		}
		const stream = 250
		var (
			// One core. A channel, not a mutex: a goroutine blocked on a
			// mutex is not durably blocked, so synctest's clock would
			// stand still.
			cpu  = make(chan struct{}, 1)
			done atomic.Int64
		)
		if _, err := r.AddConsumerHandler("h", "shapes", func(msg *message.Message) error {
			if msg.UUID == "unknown-cost" {
				time.Sleep(5 * time.Second)
				return nil
			}
			n, _ := strconv.Atoi(msg.Metadata.Get(cost.MetadataKey))
			cpu <- struct{}{}
			time.Sleep(time.Duration(n) * 100 * time.Microsecond)
			done.Add(1)
			<-cpu
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		errc := runRouter(t, r)

		// Unstamped, so it is charged the whole budget and not measured.
		if err := r.back.publisher().Publish("shapes", message.NewMessage("unknown-cost", pingPayload(0))); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if r.budget.Stats().InUse != 1000 {
			t.Fatalf("the unknown-cost message holds %d of 1000", r.budget.Stats().InUse)
		}
		for i := range stream {
			publishCosted(t, r, "shapes", fmt.Sprintf("m%03d", i), 100)
		}
		time.Sleep(5*time.Second + stream*10*time.Millisecond + time.Second)
		synctest.Wait()

		if n := done.Load(); n != stream {
			t.Errorf("%d of %d handled", n, stream)
		}
		b := r.sizer.Bounds()
		resizeMu.Lock()
		defer resizeMu.Unlock()
		if b.VerticesPerSecond < 9_900 || b.VerticesPerSecond > 10_100 {
			t.Errorf("measured %.0f vertices/s, want 10000", b.VerticesPerSecond)
		}
		if len(resizes) == 0 || resizes[0].from != 1000 || resizes[0].to != b.DeadlineBound || b.DeadlineBound < 9_900 || b.DeadlineBound > 10_100 {
			t.Errorf("resizes %v, deadline bound %d: want a resize from 1000 to the deadline bound, about 10000", resizes, b.DeadlineBound)
		}
		// On its one core the larger budget completes no more per second,
		// so the sizer goes back to 1000, where the throughput binds, and
		// tries the deadline bound again a window later.
		for _, rs := range resizes[1:] {
			if rs.to != 1000 && rs.to != b.DeadlineBound {
				t.Errorf("resizes %v: want only 1000 and the deadline bound", resizes)
			}
		}
		if b.Binding != "deadline" && b.Binding != "throughput" || b.Budget != resizes[len(resizes)-1].to {
			t.Errorf("bounds: %+v", b)
		}
		if st := r.Stats(); st.Budget.Capacity != b.Budget || st.AutoSize == nil || *st.AutoSize != b {
			t.Errorf("stats: capacity %d, autosize %+v", st.Budget.Capacity, st.AutoSize)
		}
		closeRouter(t, r, errc)
	})
}
