package router

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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
	if len(ls) != 3 || ls[0].Name != "positions" || ls[1].Capacity != 900 { // positions reserves 100
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
	mw, err := middleware.New(vb)
	if err != nil {
		t.Fatal(err)
	}
	r := &Router{budget: vb, budgetMW: mw}
	p := r.sheddingPressure(pressureBudget).(budgetPressure)
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

// A lane that selects a handler or topic no registered handler has would
// match nothing and send its traffic to the last lane: Run refuses to start,
// naming each such selector, the lane, and what exists.
func TestRunRejectsLaneSelectorsThatMatchNothing(t *testing.T) {
	cfg := Config{}
	cfg.Telemetry.Disabled = true
	cfg.Budget.Lanes = []middleware.Lane{
		{Name: "fast", Handlers: []string{"positons"}},
		{Name: "shapes", Topics: []string{"positions", "boundries"}},
		{Name: "rest"},
	}
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	nop := func(*message.Message) error { return nil }
	for _, h := range []string{"positions", "boundaries"} {
		if _, err := r.AddConsumerHandler(h, h, nop); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatal("Run did not return")
	}
	if !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Fatalf("Run = %v, want a config error", err)
	}
	got := map[string]*spillway.FieldError{}
	for _, e := range unwrapAll(err) {
		var fe *spillway.FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("not a FieldError: %v", e)
		}
		got[fe.Field+"="+fe.Value] = fe
	}
	if len(got) != 2 {
		t.Errorf("errors = %v, want two", err)
	}
	for key, want := range map[string][]string{
		"budget.lanes[0].handlers=positons": {`lane "fast"`, "boundaries, boundaries.retry, positions, positions.retry", `did you mean "positions"?`},
		"budget.lanes[1].topics=boundries":  {`lane "shapes"`, "boundaries, boundaries.retry, positions, positions.retry", `did you mean "boundaries"?`},
	} {
		fe := got[key]
		if fe == nil {
			t.Errorf("no error on %s in %v", key, err)
			continue
		}
		for _, w := range want {
			if !strings.Contains(fe.Reason, w) {
				t.Errorf("%s: reason %q lacks %q", key, fe.Reason, w)
			}
		}
	}
	if _, err := r.AddConsumerHandler("late", "late", nop); err == nil {
		t.Error("the router still takes handlers after Run refused to start")
	}
}

// With valid selectors the router runs, and Stats shows each lane: its
// name, its effective weight, what it holds and what it admitted.
func TestStatsShowsLanes(t *testing.T) {
	cfg := Config{}
	cfg.Telemetry.Disabled = true
	cfg.Budget.Vertices = 1000
	cfg.Budget.Lanes = []middleware.Lane{
		{Name: "fast", Handlers: []string{"positions"}, Reserve: 0.1},
		{Name: "rest", Weight: 3},
	}
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	done := make(chan struct{}, 1)
	if _, err := r.AddConsumerHandler("positions", "positions", func(*message.Message) error {
		done <- struct{}{}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-runErr:
		t.Fatalf("Run = %v", err)
	}
	if err := r.Publisher().Publish("positions", message.NewMessage("1", []byte(`{"type":"Point","coordinates":[1,2]}`))); err != nil {
		t.Fatal(err)
	}
	<-done
	ls := r.Stats().Lanes
	if len(ls) != 2 || ls[0].Name != "fast" || ls[0].Capacity != 1000 ||
		ls[1].Name != "rest" || ls[1].Capacity != 900 { // fast reserves 100
		t.Fatalf("Stats().Lanes = %+v", ls)
	}
	waitFor(t, "the fast lane's admission", func() bool { return r.Stats().Lanes[0].Admitted == 1 })
	if a := r.Stats().Lanes[1].Admitted; a != 0 {
		t.Errorf("rest lane admitted %d", a)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
}
