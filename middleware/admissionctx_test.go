package middleware

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
)

type ctxMarker struct{}

// The handler finds the charge its message was admitted with in the
// message's context, as the estimator priced it (the budget clamped it to
// 100), on top of the context the middleware received, which is the
// message's again once the handler has returned.
func TestBudgetPassesAdmittedChargeInContext(t *testing.T) {
	mw := newAdmitter(t, mustVertexBudget(100))
	var got cost.Charge
	var found bool
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		got, found = cost.AdmittedFromCtx(msg.Context())
		if msg.Context().Value(ctxMarker{}) != "outer" {
			t.Error("the handler's context lost the values of the context the middleware received")
		}
		return nil, nil
	})
	msg := message.NewMessage("m", nil)
	msg.Metadata.Set(cost.MetadataKey, "250")
	outer := context.WithValue(context.Background(), ctxMarker{}, "outer")
	msg.SetContext(outer)
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	if want := (cost.Charge{Vertices: 250, Messages: 1, Source: cost.SourceHeader}); !found || got != want {
		t.Fatalf("admitted charge = %+v, %v; want %+v", got, found, want)
	}
	if msg.Context() != outer {
		t.Fatal("the message keeps the admission's context after the handler returned")
	}
}

// A message the budget refuses runs nothing, and its context carries no
// admitted charge afterwards.
func TestBudgetRefusedCarriesNoAdmittedCharge(t *testing.T) {
	mw := newAdmitter(t, mustVertexBudget(100), WithMaxVertices(50))
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) {
		t.Error("the handler ran for a refused message")
		return nil, nil
	})
	msg := message.NewMessage("m", nil)
	msg.Metadata.Set(cost.MetadataKey, "60")
	if _, err := h(msg); err == nil {
		t.Fatal("an oversize message was not refused")
	}
	if c, ok := cost.AdmittedFromCtx(msg.Context()); ok {
		t.Fatalf("refused message carries admitted charge %+v", c)
	}
}

// innerCount charges the count under the metadata key inner_count.
type innerCount struct{}

func (innerCount) Estimate(msg *message.Message) cost.Charge {
	n, src := cost.ParseCount(msg.Metadata.Get("inner_count"), len(msg.Payload))
	return cost.Charge{Vertices: n, Messages: 1, Source: src}
}

// Inside nested budgets each layer sees the charge of the budget right
// outside it.
func TestBudgetNestedAdmittedCharge(t *testing.T) {
	outer := newAdmitter(t, mustVertexBudget(1_000))
	inner := newAdmitter(t, mustVertexBudget(100), WithEstimator(innerCount{}))
	var seen []int64
	record := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			c, _ := cost.AdmittedFromCtx(msg.Context())
			seen = append(seen, c.Vertices)
			return h(msg)
		}
	}
	h := outer.Middleware(record(inner.Middleware(record(func(*message.Message) ([]*message.Message, error) {
		return nil, nil
	}))))
	msg := message.NewMessage("m", nil)
	msg.Metadata.Set(cost.MetadataKey, "300")
	msg.Metadata.Set("inner_count", "30")
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[0] != 300 || seen[1] != 30 {
		t.Fatalf("charges seen outside and inside the inner budget = %v, want [300 30]", seen)
	}
}
