package shedding_test

import (
	"testing"
	"testing/synctest"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/shedding"
)

// TestEdgeCoalesceRedeliveryNeverSupersedes: without versions coalescing
// goes by arrival order, and a redelivery (or retry copy) arriving while a
// fresh message of its entity waits says nothing about which is newer: it
// must not make the fresh one step aside. A fresh message arriving after a
// waiting redelivery still supersedes it, and with versions the higher one
// wins whatever arrived how.
func TestEdgeCoalesceRedeliveryNeverSupersedes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fullConfig
		cfg.Priority.Disabled = true
		redelivered := func(m *message.Message) bool { return m.Metadata.Get("test_redelivered") == "yes" }
		r := newRigWith(t, cfg, nil, []shedding.Option{shedding.WithRedelivery(redelivered)}, "vehicles")
		hold := r.hold()

		// bus-a: fresh first, then a redelivery of an older update.
		r.publish("vehicles", msg("a-fresh", "entity_id", "bus-a"))
		synctest.Wait()
		r.publish("vehicles", msg("a-redelivered", "entity_id", "bus-a", "test_redelivered", "yes"))
		synctest.Wait()
		// bus-b: a redelivery waits, then a fresh message arrives.
		r.publish("vehicles", msg("b-redelivered", "entity_id", "bus-b", "test_redelivered", "yes"))
		synctest.Wait()
		r.publish("vehicles", msg("b-fresh", "entity_id", "bus-b"))
		synctest.Wait()
		// bus-c: versions on both decide: a redelivered newer version
		// supersedes the waiting older one.
		r.publish("vehicles", msg("c-v1", "entity_id", "bus-c", "entity_version", "1"))
		synctest.Wait()
		r.publish("vehicles", msg("c-v2-redelivered", "entity_id", "bus-c", "entity_version", "2", "test_redelivered", "yes"))
		synctest.Wait()

		hold.Release()
		synctest.Wait()
		want := []string{"a-fresh", "a-redelivered", "b-fresh", "c-v2-redelivered"}
		if got := r.seen["vehicles"].uuids(); !sameSet(got, want) {
			t.Fatalf("handled %v, want %v", got, want)
		}
		var superseded []string
		for _, a := range r.audit.snapshot() {
			superseded = append(superseded, a.UUID)
		}
		if want := []string{"b-redelivered", "c-v1"}; !sameSet(superseded, want) {
			t.Fatalf("superseded %v, want %v", superseded, want)
		}
		if st := r.stats("vehicles"); st.Superseded != 2 || shedding.InFlight(r.pol) != 0 {
			t.Fatalf("stats %+v, in flight %d", st, shedding.InFlight(r.pol))
		}
	})
}
