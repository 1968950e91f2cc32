package router

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/middleware"
)

// budget.lanes loads from YAML, reaches the router's budget, and is
// validated with errors that name the lane's key.
func TestBudgetLanesConfig(t *testing.T) {
	clearEnv(t)
	p := writeConfig(t, `budget:
  vertices: 1000
  lanes:
    - {name: positions, handlers: [positions], reserve: 0.1}
    - name: light
      max_charge: 100
      weight: 2
    - {name: boundaries, topics: [boundaries]}
`)
	c, src, err := LoadConfigSources(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []middleware.Lane{
		{Name: "positions", Handlers: []string{"positions"}, Reserve: 0.1},
		{Name: "light", MaxCharge: 100, Weight: 2},
		{Name: "boundaries", Topics: []string{"boundaries"}},
	}
	if len(c.Budget.Lanes) != len(want) {
		t.Fatalf("lanes = %+v", c.Budget.Lanes)
	}
	for i := range want {
		g, w := c.Budget.Lanes[i], want[i]
		if g.Name != w.Name || g.Weight != w.Weight || g.Reserve != w.Reserve || g.MaxCharge != w.MaxCharge ||
			strings.Join(g.Handlers, ",") != strings.Join(w.Handlers, ",") || strings.Join(g.Topics, ",") != strings.Join(w.Topics, ",") {
			t.Errorf("lane %d = %+v, want %+v", i, g, w)
		}
	}
	if src["budget.lanes"] != p+":4" { // the line of the value, the first item
		t.Errorf("source of budget.lanes = %q", src["budget.lanes"])
	}
	r, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ls := r.budget.Lanes()
	if len(ls) != 3 || ls[0].Name != "positions" || ls[0].Reserved != 100 {
		t.Fatalf("router budget lanes = %+v", ls)
	}
	if !strings.Contains(c.String(), "lanes:") {
		t.Errorf("config print has no lanes:\n%s", c)
	}

	for _, tt := range []struct {
		yaml, field, value string
	}{
		{"budget:\n  lanes:\n    - {name: a, wieght: 2}\n", "budget.lanes[0].wieght", "wieght"},
		{"budget:\n  lanes:\n    - {name: a}\n    - {name: a}\n", "budget.lanes[1].name", "a"},
		{"budget:\n  lanes:\n    - {name: a, reserve: 0.7}\n    - {name: b, reserve: 0.3}\n", "budget.lanes[1].reserve", "0.3"},
		{"budget:\n  lanes:\n    - {weight: 1}\n", "budget.lanes[0].name", ""},
		{"budget:\n  lanes:\n    - {name: a, weight: -1}\n", "budget.lanes[0].weight", "-1"},
		{"budget:\n  lanes:\n    - {name: a, max_charge: lots}\n", "budget.lanes[0].max_charge", "lots"},
	} {
		_, err := LoadConfig(writeConfig(t, tt.yaml))
		var fe *spillway.FieldError
		found := false
		for _, e := range unwrapAll(err) {
			if errors.As(e, &fe) && fe.Field == tt.field && fe.Value == tt.value {
				found = true
			}
		}
		if !found {
			t.Errorf("%q: %v, want an error on %s = %q", tt.yaml, err, tt.field, tt.value)
		}
	}
}

func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// With lanes, the budget pressure that shedding and the retry gate read is
// the message's own lane: a saturated heavy lane does not saturate a light
// lane within its reservation.
func TestBudgetPressurePerLane(t *testing.T) {
	vb, err := middleware.NewVertexBudget(1000, middleware.WithLanes(
		middleware.Lane{Name: "light", MaxCharge: 100, Reserve: 0.1}, middleware.Lane{Name: "heavy"}))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := middleware.NewBudget(middleware.BudgetConfig{Budget: vb})
	if err != nil {
		t.Fatal(err)
	}
	r := &Router{budget: vb, budgetMW: mw}
	p := r.sheddingPressure(PressureBudget).(budgetPressure)
	held, _ := vb.Acquire(context.Background(), 900)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if q, err := vb.Acquire(ctx, 500); err == nil {
			q.Release()
		}
	}()
	waitFor(t, "the heavy waiter", func() bool { return vb.Stats().Waiting == 1 })
	ping := message.NewMessage("p", nil)
	ping.Metadata.Set("vertex_count", "1")
	heavy := message.NewMessage("h", nil)
	heavy.Metadata.Set("vertex_count", "5000")
	if d := p.SaturatedForMessage(ping); d != 0 {
		t.Errorf("light lane saturated for %v", d)
	}
	if p.SaturatedForMessage(heavy) == 0 || p.SaturatedFor() == 0 {
		t.Error("heavy lane or budget not saturated")
	}
	cancel()
	<-done
	held.Release()
}
