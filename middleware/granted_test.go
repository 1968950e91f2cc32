package middleware

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/granted"
)

// The budget middleware publishes the granted charge to the layers inside
// only once a reader exists (granted.Want): the record costs two locks per
// message, for nothing without an auto-sizer.
func TestBudgetPublishesGrantedOnlyWhenWanted(t *testing.T) {
	mw, err := NewBudget(BudgetConfig{Budget: mustVertexBudget(100)})
	if err != nil {
		t.Fatal(err)
	}
	var got granted.Charge
	var found bool
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		got, found = granted.Get(msg)
		return nil, nil
	})
	msg := message.NewMessage("m", nil)
	msg.Metadata.Set(cost.MetadataKey, "250")
	// Nothing else in this test binary asks for the record: only a
	// second run of this test (-count) finds it wanted already.
	if !granted.Wanted() {
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
		if found {
			t.Fatalf("granted charge %+v published with no reader", got)
		}
		granted.Want()
	}
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	if !found || got.Requested != 250 || got.Vertices != 100 || !got.Clamped || got.Source != cost.SourceHeader {
		t.Fatalf("granted = %+v, %v; want 250 requested, 100 granted, clamped, from the header", got, found)
	}
	if _, ok := granted.Get(msg); ok {
		t.Fatal("the granted record outlives the handler")
	}
}

// A hook that panics once the charge is taken (OnAdmission with outcome
// Admitted) leaves nothing held: the refund is deferred before the hook
// runs.
func TestBudgetRefundsWhenOnAdmissionPanics(t *testing.T) {
	vb := mustVertexBudget(100)
	mw, err := NewBudget(BudgetConfig{Budget: vb, OnAdmission: func(_ *message.Message, a Admission) {
		if a.Outcome == Admitted {
			panic("hook")
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) {
		t.Error("the handler ran although the hook panicked")
		return nil, nil
	})
	msg := message.NewMessage("m", nil)
	msg.Metadata.Set(cost.MetadataKey, "40")
	func() {
		defer func() {
			if v := recover(); v != "hook" {
				t.Errorf("recovered %v, want the hook's panic", v)
			}
		}()
		_, _ = h(msg)
	}()
	if n := vb.Stats().InUse; n != 0 {
		t.Fatalf("InUse = %d after the hook panicked, want 0", n)
	}
}
