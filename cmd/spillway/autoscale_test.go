package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-go/spillway/cmd/internal/autoscale"
)

func TestAutoscaleBadInput(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"broker":     {[]string{"--brokers", "nats"}, `unknown broker "nats"`},
		"controller": {[]string{"--runs", "spillway/cpu"}, `unknown controller "cpu"`},
		"plain":      {[]string{"--runs", "plain/drain-time"}, "use spillway workers"},
		"target":     {[]string{"--target", "0s"}, "target, tick"},
		"chart":      {[]string{"--chart", filepath.Join(dir, "missing", "c.svg")}, "--chart: cannot write"},
	} {
		code, stdout, stderr := runCLI(t, append([]string{"bench", "autoscale"}, tc.args...)...)
		if code != exitBadInput || !strings.HasPrefix(stderr, "spillway bench autoscale: ") || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d naming %q", name, code, stderr, exitBadInput, tc.want)
		}
		if stdout != "" {
			t.Errorf("%s: stdout %q", name, stdout)
		}
	}
}

// TestAutoscaleQuick runs the fleet experiment's seconds-long version:
// real worker processes (this test binary) on the child Kafka broker,
// scaled by the drain-time controller through a burst of boundaries. No
// message may be lost, none finished twice by Spillway workers, and the
// controller must scale out for the boundaries and back in after them.
func TestAutoscaleQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker and worker processes")
	}
	dir := t.TempDir()
	chart := filepath.Join(dir, "fleet.svg")
	code, stdout, stderr := runCLI(t, "bench", "autoscale", "--quick", "--json", "--quiet", "--chart", chart)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep autoscale.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("stdout is not the JSON report: %v", err)
	}
	if len(rep.Runs) == 0 {
		t.Fatal("no runs")
	}
	for _, r := range rep.Runs {
		t.Logf("%s %s/%s: %d messages, longest wait %.1fs, over target %.1fs, %.0f process-s, scale out/in %d/%d, %d duplicates, %d lost",
			r.Broker, r.Workers, r.Controller, r.Messages, r.LongestWait, r.OverTarget, r.ProcessSeconds, r.ScaleOuts, r.ScaleIns, r.Duplicates, r.Lost)
		if r.Messages != rep.Stream.Messages || r.Lost != 0 {
			t.Errorf("%s/%s: %d of %d messages sent, %d lost", r.Workers, r.Controller, r.Messages, rep.Stream.Messages, r.Lost)
		}
		if r.Workers == autoscale.KindSpillway && r.Duplicates != 0 {
			t.Errorf("%s/%s: %d messages finished more than once", r.Workers, r.Controller, r.Duplicates)
		}
		if r.Controller == autoscale.ControlDrain && (r.ScaleOuts == 0 || r.ScaleIns == 0) {
			t.Errorf("drain-time: scale out/in %d/%d, want both (decisions %+v)", r.ScaleOuts, r.ScaleIns, r.Decisions)
		}
		if len(r.Failures) > 0 {
			t.Errorf("%s/%s: workers failed: %v", r.Workers, r.Controller, r.Failures)
		}
	}
	svg, err := os.ReadFile(chart)
	if err != nil || !strings.Contains(string(svg), "<svg") || !strings.Contains(string(svg), "worker processes") {
		t.Errorf("chart: %v, %.80q", err, svg)
	}
}
