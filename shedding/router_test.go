package shedding_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/shedding"
)

// rig is a real Watermill router on a persistent GoChannel, wired as the
// router package will wire it: the policy's stages around budget
// admission, the policy's revocation hook on the budget. Every message
// costs the whole budget (no vertex_count), so admitted messages run one at
// a time. It must be created inside a synctest bubble.
type rig struct {
	t         *testing.T
	pubsub    message.Publisher
	router    *message.Router
	budget    *middleware.VertexBudget
	admission *middleware.Admitter
	revoked   atomic.Uint64 // admissions that stepped aside
	pol       *shedding.Policy
	audit     *auditLog
	seen      map[string]*handled // by topic
	done      chan struct{}
}

// newRig starts a router with one handler per topic. sub is the subscriber
// (nil: the GoChannel, which also publishes).
func newRig(t *testing.T, cfg shedding.Config, sub message.Subscriber, topics ...string) *rig {
	t.Helper()
	return newRigWith(t, cfg, sub, nil, topics...)
}

// newRigWith is newRig with extra policy options.
func newRigWith(t *testing.T, cfg shedding.Config, sub message.Subscriber, opts []shedding.Option, topics ...string) *rig {
	t.Helper()
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	if sub == nil {
		sub = ps
	}
	r := &rig{t: t, pubsub: ps, audit: &auditLog{}, seen: map[string]*handled{}, done: make(chan struct{})}
	r.budget = mustVertexBudget(1)
	var err error
	r.pol, err = shedding.New(cfg, append([]shedding.Option{shedding.WithPressure(r.budget), shedding.WithAuditPublisher(r.audit)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	r.admission, err = middleware.New(r.budget, middleware.WithRevoked(r.pol.Revoked(nil)), middleware.WithOnAdmission(countRevoked(&r.revoked)))
	if err != nil {
		t.Fatal(err)
	}
	r.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	r.router.AddMiddleware(r.pol.Middleware, r.admission.Middleware, r.pol.Admitted)
	for _, topic := range topics {
		h := &handled{}
		r.seen[topic] = h
		r.router.AddConsumerHandler(topic, topic, sub, func(m *message.Message) error {
			h.add(m)
			return nil
		})
	}
	go func() {
		defer close(r.done)
		if err := r.router.Run(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	<-r.router.Running()
	t.Cleanup(func() {
		_ = r.router.Close()
		<-r.done
		_ = ps.Close()
		if c, ok := sub.(interface{ Close() error }); ok {
			_ = c.Close()
		}
	})
	return r
}

func (r *rig) publish(topic string, msgs ...*message.Message) {
	r.t.Helper()
	for _, m := range msgs {
		if err := r.pubsub.Publish(topic, m); err != nil {
			r.t.Fatal(err)
		}
	}
}

// hold takes the whole budget, so everything else waits: sustained
// pressure, for as long as the test likes.
func (r *rig) hold() middleware.Permit {
	r.t.Helper()
	p, err := r.budget.Acquire(context.Background(), 1)
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

func (r *rig) stats(topic string) shedding.TopicStats { return shedding.Topics(r.pol)[topic] }

// batch makes n messages named prefix-i with the given metadata.
func batch(prefix string, n int, kv ...string) []*message.Message {
	out := make([]*message.Message, n)
	for i := range out {
		out[i] = msg(fmt.Sprintf("%s-%d", prefix, i), kv...)
	}
	return out
}

// A topic outside the allow-list loses nothing under pressure sustained far
// beyond the window: every message published is handled exactly once.
func TestRouterNonSheddableLosesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fullConfig // vehicles sheddable, guard and coalescing on
		r := newRig(t, cfg, nil, "parcels", "vehicles")
		hold := r.hold()

		// Low priority, one entity, the same version over and over: all of
		// it would be dropped on a sheddable topic.
		early := batch("early", 100, "region_priority", "0", "entity_id", "p", "entity_version", "1")
		r.publish("parcels", early...)
		time.Sleep(45 * time.Second)
		if !r.pol.Stats().Shedding {
			t.Fatal("not shedding after 45s of saturation")
		}
		late := batch("late", 100, "region_priority", "0", "entity_id", "p", "entity_version", "1")
		r.publish("parcels", late...)
		synctest.Wait()
		if r.budget.Stats().Waiting != 200 || r.seen["parcels"].len() != 0 {
			t.Fatalf("waiting %d, handled %d", r.budget.Stats().Waiting, r.seen["parcels"].len())
		}
		hold.Release()
		synctest.Wait()

		in := append(uuidsOf(early), uuidsOf(late)...)
		if got := r.seen["parcels"].uuids(); !sameSet(got, in) {
			t.Fatalf("handled %d messages, published %d", len(got), len(in))
		}
		if st := shedding.Topics(r.pol); droppedAll(r.pol) != 0 ||
			len(r.audit.snapshot()) != 0 || r.revoked.Load() != 0 {
			t.Fatalf("something was dropped: %+v", st)
		}
	})
}

// A sheddable topic: nothing is shed before the window; after it,
// low-priority messages are shed (on arrival, and those already waiting
// once admitted) and high-priority ones handled; shedding stops when the
// pressure clears; counts and audit copies match exactly.
func TestRouterPriorityShedding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := shedding.Config{Topics: []string{"vehicles"}, AuditTopic: "shed"}
		r := newRig(t, cfg, nil, "vehicles")
		start := time.Now()
		hold := r.hold()

		lowA := append(batch("lowA", 6, "region_priority", "0"), batch("lowA-1", 2, "region_priority", "1")...)
		lowA = append(lowA, batch("lowA-missing", 2)...)
		lowA = append(lowA, batch("lowA-bad", 2, "region_priority", "high")...)
		highA := append(batch("highA", 5, "region_priority", "2"), batch("highA-9", 3, "region_priority", "9")...)

		time.Sleep(10 * time.Second)
		r.publish("vehicles", lowA...)
		r.publish("vehicles", highA...)
		time.Sleep(19 * time.Second) // t = 29s: still inside the window
		synctest.Wait()
		if r.pol.Stats().Shedding || dropped(r.stats("vehicles")) != 0 || len(r.audit.snapshot()) != 0 {
			t.Fatalf("shed before the window: %+v", r.stats("vehicles"))
		}
		if r.budget.Stats().Waiting != len(lowA)+len(highA) {
			t.Fatalf("waiting %d", r.budget.Stats().Waiting)
		}

		time.Sleep(2 * time.Second) // t = 31s
		lowB := append(batch("lowB", 7, "region_priority", "-3"), batch("lowB-missing", 3)...)
		highB := batch("highB", 4, "region_priority", "2")
		r.publish("vehicles", lowB...)
		r.publish("vehicles", highB...)
		synctest.Wait()
		// The new low-priority messages were shed on arrival, without
		// waiting for budget.
		if got := r.stats("vehicles").ShedPriority; got != uint64(len(lowB)) {
			t.Fatalf("shed on arrival %d, want %d", got, len(lowB))
		}
		if r.budget.Stats().Waiting != len(lowA)+len(highA)+len(highB) {
			t.Fatalf("waiting %d", r.budget.Stats().Waiting)
		}

		time.Sleep(9 * time.Second) // t = 40s
		hold.Release()
		synctest.Wait()
		// The low-priority waiters were shed once admitted: the pressure
		// had not cleared while the backlog drained.
		wantShed := append(uuidsOf(lowA), uuidsOf(lowB)...)
		wantHandled := append(uuidsOf(highA), uuidsOf(highB)...)
		if got := r.seen["vehicles"].uuids(); !sameSet(got, wantHandled) {
			t.Fatalf("handled %v\nwant %v", got, wantHandled)
		}
		if r.pol.Stats().Shedding || r.budget.Stats().SaturatedFor > 0 {
			t.Fatal("pressure did not clear once the backlog drained")
		}

		// Pressure cleared: low priority is handled again, even a burst that
		// queues briefly.
		time.Sleep(time.Second)
		lowC := batch("lowC", 10, "region_priority", "0")
		r.publish("vehicles", lowC...)
		synctest.Wait()
		wantHandled = append(wantHandled, uuidsOf(lowC)...)
		if got := r.seen["vehicles"].uuids(); !sameSet(got, wantHandled) {
			t.Fatalf("after the pressure cleared, handled %d, want %d", len(got), len(wantHandled))
		}

		st := r.stats("vehicles")
		audit := r.audit.snapshot()
		if st.ShedPriority != uint64(len(wantShed)) || dropped(st) != st.ShedPriority || !sameSet(uuidsOf(audit), wantShed) {
			t.Fatalf("stats %+v, audit %d, want %d shed", st, len(audit), len(wantShed))
		}
		if st.MalformedPriority != 2 {
			t.Errorf("MalformedPriority %d", st.MalformedPriority)
		}
		// In = out: every message was either handled or shed, never both.
		if n := len(r.seen["vehicles"].uuids()) + len(audit); n != len(lowA)+len(highA)+len(lowB)+len(highB)+len(lowC) {
			t.Fatalf("in %d, out %d", len(lowA)+len(highA)+len(lowB)+len(highB)+len(lowC), n)
		}
		for _, a := range audit {
			at, err := time.Parse(time.RFC3339Nano, a.Metadata.Get("spillway_shed_at"))
			if err != nil {
				t.Fatal(err)
			}
			// B was shed on arrival at 31s, A on admission at 40s.
			want := start.Add(40 * time.Second)
			if a.UUID[:4] == "lowB" {
				want = start.Add(31 * time.Second)
			}
			if !at.Equal(want) || a.Metadata.Get(shedding.MetadataReason) != "shed_priority" || a.Metadata.Get(shedding.MetadataTopic) != "vehicles" {
				t.Fatalf("audit %s: %v (want at %v)", a.UUID, a.Metadata, want)
			}
		}
	})
}

// Many updates for a few vehicles while the budget is saturated: the
// handler sees only the newest per vehicle; every superseded update is
// acked, counted and audited; the non-sheddable topic keys on the same
// entity ids and loses nothing.
func TestRouterCoalescing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const vehicles, updates = 5, 40
		cfg := fullConfig
		cfg.Priority.Disabled = true
		r := newRig(t, cfg, nil, "vehicles", "parcels")
		hold := r.hold()

		var all []*message.Message
		for v := 0; v < vehicles; v++ {
			for u := 1; u <= updates; u++ {
				all = append(all, msg(fmt.Sprintf("bus%d-v%d", v, u),
					"entity_id", fmt.Sprintf("bus-%d", v), "entity_version", strconv.Itoa(u), "region_priority", "9"))
			}
		}
		rng := rand.New(rand.NewPCG(1, 2))
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		parcels := batch("parcel", vehicles*updates/10, "entity_id", "bus-1", "entity_version", "1")
		for i, m := range all {
			r.publish("vehicles", m)
			if i%10 == 0 {
				r.publish("parcels", parcels[i/10])
			}
		}
		synctest.Wait()
		st := r.stats("vehicles")
		if st.Superseded != vehicles*(updates-1) {
			t.Fatalf("superseded %d, want %d", st.Superseded, vehicles*(updates-1))
		}
		if w := r.budget.Stats().Waiting; w != vehicles+len(parcels) {
			t.Fatalf("waiting %d, want %d", w, vehicles+len(parcels))
		}
		hold.Release()
		synctest.Wait()

		var want []string
		for v := 0; v < vehicles; v++ {
			want = append(want, fmt.Sprintf("bus%d-v%d", v, updates))
		}
		if got := r.seen["vehicles"].uuids(); !sameSet(got, want) {
			t.Fatalf("handled %v, want the newest of each vehicle %v", got, want)
		}
		if got := r.seen["parcels"].uuids(); !sameSet(got, uuidsOf(parcels)) {
			t.Fatalf("parcels handled %d of %d", len(got), len(parcels))
		}
		audit := r.audit.snapshot()
		if len(audit) != vehicles*(updates-1) {
			t.Fatalf("audit %d", len(audit))
		}
		handledSet := map[string]bool{}
		for _, u := range want {
			handledSet[u] = true
		}
		for _, a := range audit {
			if handledSet[a.UUID] || a.Metadata.Get(shedding.MetadataReason) != "superseded" {
				t.Fatalf("audit %s %v", a.UUID, a.Metadata)
			}
		}
		if got := len(r.seen["vehicles"].uuids()) + len(audit); got != len(all) {
			t.Fatalf("in %d, out %d", len(all), got)
		}
		if st := shedding.Topics(r.pol); shedding.InFlight(r.pol) != 0 || dropped(st["vehicles"]) != vehicles*(updates-1) {
			t.Fatalf("stats %+v", st)
		}
		// Some of them waited and stepped aside; the budget calls that a
		// revocation.
		if rv := r.revoked.Load(); rv == 0 || rv > vehicles*(updates-1) {
			t.Fatalf("revocations %d", rv)
		}
	})
}

// Without versions, the later arrival wins.
func TestRouterCoalescingWithoutVersions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fullConfig
		cfg.Priority.Disabled = true
		r := newRig(t, cfg, nil, "vehicles")
		hold := r.hold()
		for i := 0; i < 20; i++ {
			r.publish("vehicles", msg(fmt.Sprintf("a%d", i), "entity_id", "bus-a"), msg(fmt.Sprintf("b%d", i), "entity_id", "bus-b"))
		}
		synctest.Wait()
		hold.Release()
		synctest.Wait()
		if n := r.seen["vehicles"].len(); n != 2 {
			t.Fatalf("handled %d, want one per vehicle", n)
		}
		if st := r.stats("vehicles"); st.Superseded != 38 {
			t.Fatalf("superseded %d", st.Superseded)
		}
	})
}

// Through the router, the guard drops only stale versions, and a handler
// failure (nack, redelivery) does not make the redelivery stale.
func TestRouterVersionGuard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := shedding.Config{Topics: []string{"vehicles"}, AuditTopic: "shed", VersionGuard: shedding.VersionGuardConfig{Enabled: true}}
		r := newRig(t, cfg, nil, "vehicles")
		versions := []string{"1", "3", "2", "3", "5", "4", "6"}
		for i, v := range versions {
			r.publish("vehicles", msg(fmt.Sprintf("m%d-v%s", i, v), "entity_id", "tram-7", "entity_version", v, "region_priority", "5"))
			synctest.Wait() // one at a time, in order
		}
		want := []string{"m0-v1", "m1-v3", "m4-v5", "m6-v6"}
		if got := r.seen["vehicles"].uuids(); !sameSet(got, want) {
			t.Fatalf("handled %v, want %v", got, want)
		}
		if st := r.stats("vehicles"); st.StaleVersion != 3 || len(r.audit.snapshot()) != 3 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// mustVertexBudget is middleware.NewVertexBudget for capacities the test knows
// are valid.
func mustVertexBudget(capacity int64, opts ...middleware.Option) *middleware.VertexBudget {
	b, err := middleware.NewVertexBudget(capacity, opts...)
	if err != nil {
		panic(err)
	}
	return b
}
