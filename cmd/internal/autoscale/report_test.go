package autoscale

import (
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestParseDone(t *testing.T) {
	in := "a 1 2000000000 7\nb 1 3000000000 8\nc 1 40"
	recs, err := parseDone(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].id != "a" || !recs[0].at.Equal(time.Unix(2, 0)) || recs[1].pid != 8 {
		t.Fatalf("records %+v, want a and b (the unfinished last line left out)", recs)
	}
	if _, err := parseDone(strings.NewReader("a b\n")); err == nil {
		t.Error("a short line parsed")
	}
}

func TestAnalyse(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := func(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }
	msgs := []sent{
		{"a", s(0), 1},   // done at 2: wait 2, under the target
		{"b", s(0), 10},  // done at 9 and again at 12: wait 9, over the target from 5 to 9; a duplicate
		{"c", s(6), 100}, // done at 14: wait 8, over from 11 to 14
		{"d", s(20), 5},  // never done: lost, over from 25 to the end at 30
	}
	recs := []done{
		{"a", s(2), 1}, {"b", s(12), 2}, {"b", s(9), 1}, {"c", s(14), 1},
		{"zz", s(3), 1}, // not sent by this run: ignored
	}
	o := analyse(msgs, recs, 5*time.Second, s(30))
	if o.Lost != 1 || o.Duplicates != 1 {
		t.Errorf("lost %d, duplicates %d; want 1, 1", o.Lost, o.Duplicates)
	}
	if o.LongestWait != 10*time.Second { // d: from 20 to the end at 30
		t.Errorf("longest wait %s, want 10s", o.LongestWait)
	}
	// [5,9] ∪ [11,14] ∪ [25,30] = 4 + 3 + 5 s.
	if o.OverTarget != 12*time.Second {
		t.Errorf("over target %s, want 12s", o.OverTarget)
	}
	if got := backlogAt(msgs, o.finished, s(10)); got != 100 { // c only (b's first finish was at 9)
		t.Errorf("backlog at 10 s: %d, want 100", got)
	}
	if got := backlogAt(msgs, o.finished, s(7)); got != 110 {
		t.Errorf("backlog at 7 s: %d, want 110", got)
	}
}

func TestUnionLength(t *testing.T) {
	t0 := time.Unix(0, 0)
	iv := func(a, b int) [2]time.Time {
		return [2]time.Time{t0.Add(time.Duration(a) * time.Second), t0.Add(time.Duration(b) * time.Second)}
	}
	// Overlapping, nested, touching and apart, out of order.
	got := unionLength([][2]time.Time{iv(10, 12), iv(0, 4), iv(2, 6), iv(3, 5), iv(6, 7)})
	if got != 9*time.Second { // [0,7] and [10,12]
		t.Errorf("union %s, want 9s", got)
	}
	if unionLength(nil) != 0 {
		t.Error("empty union is not 0")
	}
}

func TestProcessesAt(t *testing.T) {
	spans := [][2]float64{{-1, 10}, {3, 6}, {5, 20}}
	for _, tc := range []struct {
		t    float64
		want int
	}{{0, 1}, {3, 2}, {5.5, 3}, {6, 2}, {10, 1}, {20, 0}} {
		if got := processesAt(spans, tc.t); got != tc.want {
			t.Errorf("processes at %v: %d, want %d", tc.t, got, tc.want)
		}
	}
}

// TestDrainSignal evaluates docs/scaling.md's query over two workers'
// pages: each partition counted once, at its largest estimate; the rate
// averaged over the workers; other groups and sources left out.
func TestDrainSignal(t *testing.T) {
	page := func(text string) map[string]*dto.MetricFamily {
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		return fams
	}
	a := page(`# TYPE spillway_backlog_vertices gauge
spillway_backlog_vertices{group="g.work",partition="0",source="spillway",topic="t"} 1000
spillway_backlog_vertices{group="g.work",partition="1",source="spillway",topic="t"} 500
spillway_backlog_vertices{group="other.work",partition="0",source="spillway",topic="t"} 99999
# TYPE spillway_drain_rate_per_second gauge
spillway_drain_rate_per_second{source="spillway"} 300
spillway_drain_rate_per_second{source="other"} 99999
`)
	b := page(`# TYPE spillway_backlog_vertices gauge
spillway_backlog_vertices{group="g.work",partition="0",source="spillway",topic="t"} 1200
spillway_backlog_vertices{group="g.work",partition="1",source="spillway",topic="t"} 400
# TYPE spillway_drain_rate_per_second gauge
spillway_drain_rate_per_second{source="spillway"} 100
`)
	s := drainSignal([]map[string]*dto.MetricFamily{a, b}, "g.work")
	if s.Backlog != 1700 || s.Rate != 200 || s.Rates != 2 {
		t.Fatalf("signal %+v, want backlog 1700 (1200 + 500), rate 200 over 2", s)
	}
	if secs, ok := s.Seconds(); !ok || secs != 8.5 {
		t.Errorf("seconds %v, %v; want 8.5", secs, ok)
	}
	if s := drainSignal(nil, "g.work"); s != (DrainSignal{}) {
		t.Errorf("no pages: %+v", s)
	}
}
