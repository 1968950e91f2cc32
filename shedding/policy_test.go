package shedding_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/shedding"
)

// topicOf reads the topic from metadata, so the unit tests can drive the
// middleware without a router.
func topicOf(m *message.Message) string { return m.Metadata.Get("topic") }

func passThrough(h message.HandlerFunc) message.HandlerFunc { return h }

type unit struct {
	pol   *shedding.Policy
	run   message.HandlerFunc
	seen  *handled
	audit *auditLog
	shed  []string // "topic/reason/uuid" from the OnShed hook
}

func newUnit(t *testing.T, cfg shedding.Config, p spillway.Pressure, admission message.HandlerMiddleware) *unit {
	t.Helper()
	u := &unit{seen: &handled{}, audit: &auditLog{}}
	pol, err := shedding.New(cfg, shedding.WithPressure(p),
		shedding.WithTopicFunc(topicOf),
		shedding.WithAuditPublisher(u.audit),
		shedding.WithOnShed(func(m *message.Message, topic, r string) {
			u.shed = append(u.shed, topic+"/"+r+"/"+m.UUID)
		}))
	if err != nil {
		t.Fatal(err)
	}
	if admission == nil {
		admission = passThrough
	}
	u.pol = pol
	u.run = wrap(pol, admission)(func(m *message.Message) ([]*message.Message, error) {
		u.seen.add(m)
		return nil, nil
	})
	return u
}

// deliver runs m through the chain and acks it on success, as the router
// does.
func (u *unit) deliver(t *testing.T, m *message.Message) error {
	t.Helper()
	_, err := u.run(m)
	if err == nil {
		m.Ack()
	} else {
		m.Nack()
	}
	return err
}

var fullConfig = shedding.Config{
	Topics:       []string{"vehicles"},
	AuditTopic:   "shed",
	VersionGuard: shedding.VersionGuardConfig{Enabled: true, MaxEntities: 100},
	Coalesce:     shedding.CoalesceConfig{Enabled: true},
}

// Whatever its metadata says, a message of a topic outside the allow-list
// is never dropped, even under pressure far beyond the window.
func TestNonSheddableTopicIsNeverDropped(t *testing.T) {
	p := &fakePressure{}
	p.set(time.Hour)
	u := newUnit(t, fullConfig, p, nil)
	var in []string
	for i := 0; i < 50; i++ {
		m := msg(fmt.Sprintf("p%d", i), "topic", "parcels",
			"region_priority", strconv.Itoa(i%3-1), // -1, 0, 1: all below 2
			"entity_id", "parcel-1", "entity_version", "1") // same stale version
		in = append(in, m.UUID)
		if err := u.deliver(t, m); err != nil {
			t.Fatal(err)
		}
	}
	if !sameSet(u.seen.uuids(), in) {
		t.Fatalf("handled %d of %d", u.seen.len(), len(in))
	}
	st := u.pol.Stats()
	if _, ok := shedding.Topics(u.pol)["parcels"]; ok || len(u.audit.snapshot()) != 0 || len(u.shed) != 0 {
		t.Fatalf("non-sheddable topic touched: %+v", st)
	}
	if _, vehicles := shedding.Topics(u.pol)["vehicles"]; !st.Shedding || !vehicles {
		t.Fatalf("Shedding %v", st.Shedding)
	}
}

func TestPriorityShedding(t *testing.T) {
	p := &fakePressure{}
	u := newUnit(t, shedding.Config{Topics: []string{"vehicles"}, AuditTopic: "shed"}, p, nil)
	cases := []struct {
		priority string // "" = missing
		shed     bool
	}{
		{"0", true}, {"1", true}, {"-5", true}, {"", true}, {"high", true}, {"1.5", true},
		{"2", false}, {"+2", false}, {"9", false}, {"9223372036854775807", false},
	}
	for _, pressure := range []time.Duration{0, 29 * time.Second, 30 * time.Second, 0} {
		p.set(pressure)
		before := u.seen.len()
		dropped := shedding.Topics(u.pol)["vehicles"].ShedPriority
		wantShed := 0
		for i, c := range cases {
			m := msg(fmt.Sprintf("%v-%d", pressure, i), "topic", "vehicles")
			if c.priority != "" {
				m.Metadata.Set("region_priority", c.priority)
			}
			if err := u.deliver(t, m); err != nil {
				t.Fatal(err)
			}
			if c.shed && pressure >= 30*time.Second {
				wantShed++
			}
		}
		st := shedding.Topics(u.pol)["vehicles"]
		if got := st.ShedPriority - dropped; got != uint64(wantShed) {
			t.Errorf("pressure %v: shed %d, want %d", pressure, got, wantShed)
		}
		if got := u.seen.len() - before; got != len(cases)-wantShed {
			t.Errorf("pressure %v: handled %d, want %d", pressure, got, len(cases)-wantShed)
		}
	}
	st := shedding.Topics(u.pol)["vehicles"]
	if st.MalformedPriority != 8 { // "high" and "1.5", four rounds
		t.Errorf("MalformedPriority = %d", st.MalformedPriority)
	}
	// Every drop was audited and hooked, with the reason in metadata.
	audit := u.audit.snapshot()
	if len(audit) != 6 || len(u.shed) != 6 {
		t.Fatalf("audit %d, hook %d, want 6", len(audit), len(u.shed))
	}
	for i, a := range audit {
		if a.Metadata.Get(shedding.MetadataReason) != "shed_priority" || a.Metadata.Get(shedding.MetadataTopic) != "vehicles" ||
			a.Metadata.Get("spillway_shed_at") == "" || string(a.Payload) != a.UUID || u.audit.topic[i] != "shed" {
			t.Errorf("audit copy %d: %v %q", i, a.Metadata, a.Payload)
		}
		if u.shed[i] != "vehicles/shed_priority/"+a.UUID {
			t.Errorf("hook %q", u.shed[i])
		}
	}
}

func TestPriorityOptions(t *testing.T) {
	p := &fakePressure{}
	p.set(time.Minute)
	// Missing priority treated as high: kept; malformed too.
	u := newUnit(t, shedding.Config{Topics: []string{"vehicles"}, Priority: shedding.PriorityConfig{Missing: 2, ShedBelow: 5, Window: time.Minute}}, p, nil)
	for i, pr := range []string{"", "x", "4", "5"} {
		m := msg(strconv.Itoa(i), "topic", "vehicles")
		if pr != "" {
			m.Metadata.Set("region_priority", pr)
		}
		_ = u.deliver(t, m)
	}
	if got := shedding.Topics(u.pol)["vehicles"].ShedPriority; got != 3 { // "", "x" (as 2) and "4" are below 5
		t.Errorf("shed %d, want 3", got)
	}
	// Disabled: never shed by priority, and no pressure signal needed.
	pol, err := shedding.New(shedding.Config{Topics: []string{"vehicles"}, Priority: shedding.PriorityConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	if pol.Stats().Shedding {
		t.Fatal("disabled policy sheds")
	}
}

func TestNewErrors(t *testing.T) {
	var fe *spillway.FieldError
	if _, err := shedding.New(shedding.Config{Topics: []string{"v"}}); !errors.As(err, &fe) || fe.Field != "priority.disabled" || !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Errorf("no pressure: %v", err)
	}
	if _, err := shedding.New(shedding.Config{Topics: []string{"v"}, AuditTopic: "a"}, shedding.WithPressure(&fakePressure{})); !errors.As(err, &fe) || fe.Field != "audit_topic" || fe.Value != "a" {
		t.Errorf("no audit publisher: %v", err)
	}
	if _, err := shedding.New(shedding.Config{Topics: []string{""}}, shedding.WithPressure(&fakePressure{})); !errors.As(err, &fe) || fe.Field != "topics[0]" {
		t.Errorf("invalid config: %v", err)
	}
	// No topics: inert, no pressure needed; a publisher without topic is unused.
	pol, err := shedding.New(shedding.Config{}, shedding.WithAuditPublisher(&auditLog{}))
	if err != nil || pol.Stats().Shedding || len(shedding.Topics(pol)) != 0 {
		t.Fatalf("inert policy: %v", err)
	}
}

// When the audit copy cannot be published the message is not acked: the
// error goes back to the router (nack), it is not counted as dropped, and
// the redelivery is dropped once the audit topic is back.
func TestAuditFailureNacks(t *testing.T) {
	p := &fakePressure{}
	p.set(time.Hour)
	u := newUnit(t, shedding.Config{Topics: []string{"vehicles"}, AuditTopic: "shed"}, p, nil)
	u.audit.setFail(true)
	m := msg("m1", "topic", "vehicles", "region_priority", "0")
	err := u.deliver(t, m)
	if !errors.Is(err, errAuditDown) || !strings.Contains(err.Error(), "m1") {
		t.Fatalf("err = %v", err)
	}
	st := shedding.Topics(u.pol)["vehicles"]
	if st.AuditFailed != 1 || dropped(st) != 0 || len(u.shed) != 0 || u.seen.len() != 0 {
		t.Fatalf("stats %+v, hook %v, handled %d", st, u.shed, u.seen.len())
	}
	u.audit.setFail(false)
	if err := u.deliver(t, msg("m1", "topic", "vehicles", "region_priority", "0")); err != nil {
		t.Fatal(err)
	}
	st = shedding.Topics(u.pol)["vehicles"]
	if st.ShedPriority != 1 || len(u.audit.snapshot()) != 1 {
		t.Fatalf("after recovery: %+v", st)
	}
}

func TestVersionGuard(t *testing.T) {
	u := newUnit(t, shedding.Config{
		Topics:       []string{"vehicles"},
		AuditTopic:   "shed",
		Priority:     shedding.PriorityConfig{Disabled: true},
		VersionGuard: shedding.VersionGuardConfig{Enabled: true},
	}, nil, nil)
	steps := []struct {
		entity, version string
		handled         bool
	}{
		{"bus-1", "1", true},
		{"bus-1", "3", true},
		{"bus-1", "2", false}, // older
		{"bus-1", "3", false}, // equal
		{"bus-2", "1", true},  // another entity
		{"bus-1", "4", true},
		{"bus-1", "", true},      // no version: guard off for this message
		{"bus-1", "-1", true},    // malformed: guard off, counted
		{"", "1", true},          // no entity: guard off
		{"bus-1", "0004", false}, // leading zeros are the same version
		{"bus-1", "18446744073709551615", true},
	}
	var want []string
	for i, s := range steps {
		m := msg(strconv.Itoa(i), "topic", "vehicles")
		if s.entity != "" {
			m.Metadata.Set("entity_id", s.entity)
		}
		if s.version != "" {
			m.Metadata.Set("entity_version", s.version)
		}
		if s.handled {
			want = append(want, m.UUID)
		}
		if err := u.deliver(t, m); err != nil {
			t.Fatal(err)
		}
	}
	if got := u.seen.uuids(); !sameSet(got, want) {
		t.Fatalf("handled %v, want %v", got, want)
	}
	st := u.pol.Stats()
	vs := shedding.Topics(u.pol)["vehicles"]
	if vs.StaleVersion != 3 || vs.MalformedVersion != 1 || st.MalformedVersion != 1 || dropped(vs) != 3 || st.Entities != 2 {
		t.Fatalf("stats %+v", st)
	}
	for _, a := range u.audit.snapshot() {
		if a.Metadata.Get(shedding.MetadataReason) != "stale_version" {
			t.Fatalf("audit reason %q", a.Metadata.Get(shedding.MetadataReason))
		}
	}
}

// A failed handler does not record its version, so the redelivery is
// handled; and a version counts only once its message is acked.
func TestVersionGuardRecordsOnlyAckedSuccess(t *testing.T) {
	pol, err := shedding.New(shedding.Config{
		Topics:       []string{"vehicles"},
		Priority:     shedding.PriorityConfig{Disabled: true},
		VersionGuard: shedding.VersionGuardConfig{Enabled: true},
	}, shedding.WithTopicFunc(topicOf))
	if err != nil {
		t.Fatal(err)
	}
	fail := true
	calls := 0
	run := wrap(pol, passThrough)(func(m *message.Message) ([]*message.Message, error) {
		calls++
		if fail {
			return nil, errors.New("boom")
		}
		return nil, nil
	})
	v5 := func() *message.Message {
		return msg("v5", "topic", "vehicles", "entity_id", "bus", "entity_version", "5")
	}
	if _, err := run(v5()); err == nil {
		t.Fatal("handler error swallowed")
	}
	fail = false
	if _, err := run(v5()); err != nil || calls != 2 {
		t.Fatalf("redelivery after failure: err %v, calls %d", err, calls)
	}
	// Not acked yet (the router could still nack it): not stale. m is
	// never acked, as if publishing its output failed; the latest success
	// of a version replaces an earlier unacked one.
	m3 := v5()
	if _, err := run(m3); err != nil || calls != 3 {
		t.Fatalf("unacked version counted: calls %d", calls)
	}
	m3.Ack()
	if _, err := run(v5()); err != nil || calls != 3 {
		t.Fatalf("acked version not counted: calls %d", calls)
	}
	if got := shedding.Topics(pol)["vehicles"].StaleVersion; got != 1 {
		t.Fatalf("stale %d", got)
	}
}

// Coalescing needs the Admitted stage to tell a superseded waiter from a
// handled message. Without it nothing that already waits is superseded.
func TestCoalescingInertWithoutAdmittedStage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pol, err := shedding.New(shedding.Config{
			Topics:   []string{"vehicles"},
			Priority: shedding.PriorityConfig{Disabled: true},
			Coalesce: shedding.CoalesceConfig{Enabled: true},
		}, shedding.WithTopicFunc(topicOf))
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		seen := &handled{}
		run := pol.Middleware(func(m *message.Message) ([]*message.Message, error) {
			if pol.Revoked(nil)(m) == nil {
				t.Error("no superseded channel for a coalesced message")
			}
			<-release
			seen.add(m)
			return nil, nil
		})
		for _, v := range []string{"1", "2"} {
			go func() {
				if _, err := run(msg("v"+v, "topic", "vehicles", "entity_id", "bus", "entity_version", v)); err != nil {
					t.Error(err)
				}
			}()
			synctest.Wait()
		}
		// A strictly older newcomer is still dropped at once: it never waited.
		if _, err := run(msg("v0", "topic", "vehicles", "entity_id", "bus", "entity_version", "0")); err != nil {
			t.Fatal(err)
		}
		close(release)
		synctest.Wait()
		if seen.len() != 2 || shedding.Topics(pol)["vehicles"].Superseded != 1 {
			t.Fatalf("handled %v, stats %+v", seen.uuids(), shedding.Topics(pol)["vehicles"])
		}
		if shedding.InFlight(pol) != 0 {
			t.Fatal("registrations leaked")
		}
	})
}

func TestSupersededNilCases(t *testing.T) {
	pol, err := shedding.New(fullConfig, shedding.WithPressure(&fakePressure{}), shedding.WithTopicFunc(topicOf), shedding.WithAuditPublisher(&auditLog{}))
	if err != nil {
		t.Fatal(err)
	}
	var got []bool
	run := pol.Middleware(func(m *message.Message) ([]*message.Message, error) {
		got = append(got, pol.Revoked(nil)(m) != nil)
		return nil, nil
	})
	for _, m := range []*message.Message{
		msg("a", "topic", "parcels", "entity_id", "x"), // not sheddable
		msg("b", "topic", "vehicles"),                  // no entity
		msg("c", "topic", "vehicles", "entity_id", "x"),
	} {
		if _, err := run(m); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(got) != "[false false true]" {
		t.Fatalf("superseded channels: %v", got)
	}
	if pol.Revoked(nil)(msg("d")) != nil {
		t.Fatal("channel for a message that never passed the policy")
	}
}

// Revoked composes the budget's revocation hook: a revocation from the
// other source makes a waiter step aside without being counted as
// superseded, and no goroutine outlives the message.
func TestRevokedComposition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pol, err := shedding.New(shedding.Config{
			Topics:   []string{"vehicles"},
			Priority: shedding.PriorityConfig{Disabled: true},
			Coalesce: shedding.CoalesceConfig{Enabled: true},
		}, shedding.WithTopicFunc(topicOf))
		if err != nil {
			t.Fatal(err)
		}
		session := make(chan struct{}) // a Kafka session's Done channel
		vb := mustVertexBudget(1)
		var revoked atomic.Uint64
		adm, err := middleware.New(vb,
			middleware.WithOnAdmission(countRevoked(&revoked)),
			middleware.WithRevoked(pol.Revoked(func(m *message.Message) <-chan struct{} {
				if m.Metadata.Get("kafka") != "" {
					return session
				}
				return nil
			})),
		)
		if err != nil {
			t.Fatal(err)
		}
		seen := &handled{}
		run := wrap(pol, adm.Middleware)(func(m *message.Message) ([]*message.Message, error) {
			seen.add(m)
			return nil, nil
		})
		hold, _ := vb.Acquire(context.Background(), 1)
		results := make(chan error, 3)
		for _, m := range []*message.Message{
			msg("k", "topic", "vehicles", "entity_id", "a", "kafka", "1"), // both signals: merged
			msg("p", "topic", "parcels", "entity_id", "a", "kafka", "1"),  // only the session
			msg("v", "topic", "vehicles", "entity_id", "b"),               // only superseding
		} {
			go func() { _, err := run(m); results <- err }()
		}
		synctest.Wait()
		if vb.Stats().Waiting != 3 {
			t.Fatalf("waiting %d", vb.Stats().Waiting)
		}
		close(session) // the rebalance: both Kafka deliveries step aside
		synctest.Wait()
		if vb.Stats().Waiting != 1 || revoked.Load() != 2 {
			t.Fatalf("waiting %d, revocations %d", vb.Stats().Waiting, revoked.Load())
		}
		hold.Release()
		for range 3 {
			if err := <-results; err != nil {
				t.Fatal(err)
			}
		}
		if got := seen.uuids(); len(got) != 1 || got[0] != "v" {
			t.Fatalf("handled %v", got)
		}
		if st := shedding.Topics(pol); dropped(st["vehicles"]) != 0 || shedding.InFlight(pol) != 0 {
			t.Fatalf("revocation counted as a drop: %+v", st)
		}
	})
}

// A waiter superseded after admission was granted (the grant raced with the
// newer arrival, or the budget does not watch Superseded) is dropped by the
// Admitted stage before its handler runs.
func TestSupersededAfterGrantIsDroppedBeforeHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pol, err := shedding.New(shedding.Config{
			Topics:   []string{"vehicles"},
			Priority: shedding.PriorityConfig{Disabled: true},
			Coalesce: shedding.CoalesceConfig{Enabled: true},
		}, shedding.WithTopicFunc(topicOf))
		if err != nil {
			t.Fatal(err)
		}
		open := make(chan struct{})
		// An admission stage that ignores revocation: it lets everything
		// through once open is closed.
		admission := func(h message.HandlerFunc) message.HandlerFunc {
			return func(m *message.Message) ([]*message.Message, error) {
				<-open
				return h(m)
			}
		}
		seen := &handled{}
		run := wrap(pol, admission)(func(m *message.Message) ([]*message.Message, error) {
			seen.add(m)
			return nil, nil
		})
		errs := make(chan error, 2)
		for _, v := range []string{"1", "2"} {
			go func() {
				_, err := run(msg("v"+v, "topic", "vehicles", "entity_id", "bus", "entity_version", v))
				errs <- err
			}()
			synctest.Wait()
		}
		close(open)
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if got := seen.uuids(); len(got) != 1 || got[0] != "v2" {
			t.Fatalf("handled %v", got)
		}
		if st := shedding.Topics(pol)["vehicles"]; st.Superseded != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// A superseded waiter whose audit copy cannot be published is nacked, not
// acked, and not counted.
func TestSupersededAuditFailureNacks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		audit := &auditLog{fail: true}
		pol, err := shedding.New(shedding.Config{
			Topics:     []string{"vehicles"},
			AuditTopic: "shed",
			Priority:   shedding.PriorityConfig{Disabled: true},
			Coalesce:   shedding.CoalesceConfig{Enabled: true},
		}, shedding.WithTopicFunc(topicOf), shedding.WithAuditPublisher(audit))
		if err != nil {
			t.Fatal(err)
		}
		vb := mustVertexBudget(1)
		adm, _ := middleware.New(vb, middleware.WithRevoked(pol.Revoked(nil)))
		run := wrap(pol, adm.Middleware)(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		hold, _ := vb.Acquire(context.Background(), 1)
		older := make(chan error, 1)
		go func() {
			_, err := run(msg("old", "topic", "vehicles", "entity_id", "bus"))
			older <- err
		}()
		synctest.Wait()
		newer := make(chan error, 1)
		go func() {
			_, err := run(msg("new", "topic", "vehicles", "entity_id", "bus"))
			newer <- err
		}()
		if err := <-older; !errors.Is(err, errAuditDown) {
			t.Fatalf("superseded waiter returned %v, want the audit error", err)
		}
		hold.Release()
		if err := <-newer; err != nil {
			t.Fatal(err)
		}
		if st := shedding.Topics(pol)["vehicles"]; st.Superseded != 0 || st.AuditFailed != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}
