package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-go/spillway/cmd/internal/autoscale"
	"github.com/spillway-go/spillway/cmd/internal/kafkaproc"
	"github.com/spillway-go/spillway/cmd/internal/scaling"
)

// "spillway bench" runs its Kafka broker, and "spillway bench autoscale"
// its workers, as child processes of this executable: here, the test
// binary.
func TestMain(m *testing.M) {
	if kafkaproc.ServeIfAsked() || autoscale.ServeWorkerIfAsked() {
		return
	}
	os.Exit(m.Run())
}

func TestBenchBadInput(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"broker":      {[]string{"bench", "--brokers", "nats"}, `unknown broker "nats"`},
		"cost":        {[]string{"bench", "--costs", "huge"}, `unknown message cost "huge"`},
		"parallelism": {[]string{"bench", "--parallelism", "0"}, "parallelism must be 1 to 256"},
		"not a list":  {[]string{"bench", "--handlers", "one"}, "invalid argument"},
		"messages":    {[]string{"bench", "--messages", "0"}, "messages must be positive"},
		"work":        {[]string{"bench", "--work", "sleep"}, "unknown handler"},
		"chart dir":   {[]string{"bench", "--chart", filepath.Join(dir, "missing", "c.svg")}, "--chart: cannot write"},
		"results dir": {[]string{"bench", "--results", filepath.Join(dir, "missing", "r.json")}, "--results: cannot write"},
		"positional":  {[]string{"bench", "extra"}, "unknown command"},
		"from":        {[]string{"bench", "--from", filepath.Join(dir, "none.json"), "--chart", ""}, "--from: open"},
		"from json":   {[]string{"bench", "--from", "bench_test.go", "--chart", ""}, "is not a report written by --results"},
		"two formats": {[]string{"bench", "--json", "--markdown", "--chart", ""}, "--json and --markdown: choose one"},
	} {
		code, stdout, stderr := runCLI(t, tc.args...)
		if code != exitBadInput {
			t.Errorf("%s: exit %d, want %d (stderr %q)", name, code, exitBadInput, stderr)
		}
		if !strings.HasPrefix(stderr, "spillway bench: ") || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%s: stderr %q, want one line naming %q", name, stderr, tc.want)
		}
		if stdout != "" {
			t.Errorf("%s: stdout %q", name, stdout)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("files left behind: %v", entries)
	}
}

// TestBenchTiny runs the command on a one-cell sweep (embedded Kafka,
// one partition, a hundred pings) and checks the JSON on stdout, the
// results file and the chart.
func TestBenchTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an embedded Kafka broker")
	}
	dir := t.TempDir()
	chart, results := filepath.Join(dir, "c.svg"), filepath.Join(dir, "r.json")
	code, stdout, stderr := runCLI(t, "bench", "--quick", "--brokers", "kafka", "--parallelism", "1", "--handlers", "1",
		"--costs", "ping", "--messages", "100", "--json", "--quiet", "--chart", chart, "--results", results)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if stderr != "" {
		t.Errorf("--quiet, yet stderr %q", stderr)
	}
	var rep scaling.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s", err, stdout)
	}
	if len(rep.Results) != 2 || rep.Results[0].Consumer != "bare" || rep.Results[1].Consumer != "spillway" ||
		rep.Results[1].CPURatio <= 0 || !strings.HasPrefix(rep.Verdict, "verdict: NOT CHECKED") {
		t.Errorf("report: %+v", rep)
	}
	if b, err := os.ReadFile(results); err != nil || string(b) != stdout {
		t.Errorf("results file (%v) differs from stdout", err)
	}
	if b, err := os.ReadFile(chart); err != nil || !strings.Contains(string(b), "<svg") {
		t.Errorf("chart: %v %.200s", err, b)
	}

	// --from renders the saved report again without running anything.
	again := filepath.Join(dir, "again.svg")
	code, stdout, stderr = runCLI(t, "bench", "--from", results, "--chart", again)
	if code != exitOK || stderr != "" || !strings.Contains(stdout, rep.Verdict) || !strings.Contains(stdout, "CPU µs/msg") {
		t.Errorf("--from: exit %d, stderr %q, stdout:\n%s", code, stderr, stdout)
	}
	if b, err := os.ReadFile(again); err != nil || !strings.Contains(string(b), "<svg") {
		t.Errorf("--from chart: %v %.200s", err, b)
	}

	// --markdown: a Markdown table, one row per cell, the verdict last.
	code, stdout, stderr = runCLI(t, "bench", "--from", results, "--chart", "", "--markdown")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	cells := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "| kafka | ") || strings.HasPrefix(l, "| redis | ") {
			cells++
			if strings.Count(l, " | ") != 10 {
				t.Errorf("--markdown row %q: want 11 columns", l)
			}
		}
	}
	if code != exitOK || stderr != "" || cells != len(rep.Results)/2 || lines[len(lines)-1] != rep.Verdict {
		t.Errorf("--markdown: exit %d, stderr %q, %d cells for %d results, stdout:\n%s", code, stderr, cells, len(rep.Results), stdout)
	}
}
