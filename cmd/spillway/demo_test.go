package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDemoBadInput(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"broker":      {[]string{"demo", "--broker", "nats"}, "broker must be kafka or redis"},
		"deadline":    {[]string{"demo", "--deadline", "0s"}, "--deadline must be positive"},
		"short":       {[]string{"demo", "--deadline", "50ms"}, "deadline must be a whole number of milliseconds, at least 100ms"},
		"zero rate":   {[]string{"demo", "--rate", "0"}, "--rate and --parcels must be positive"},
		"group":       {[]string{"demo", "--groups", "naive,fast"}, `unknown group "fast"`},
		"consumer":    {[]string{"demo", "--kafka-consumer", "unordered"}, "--kafka-consumer must be partition or key"},
		"key redis":   {[]string{"demo", "--broker", "redis", "--kafka-consumer", "key"}, "group spillway-key needs broker kafka"},
		"memory":      {[]string{"demo", "--memory", "0"}, "--memory must be positive"},
		"fail rate":   {[]string{"demo", "--fail-rate", "1.5"}, "fail rate"},
		"burst time":  {[]string{"demo", "--burst-at", "1h"}, "burst time"},
		"report dir":  {[]string{"demo", "--report", filepath.Join(dir, "missing", "r.html")}, "--report: cannot write"},
		"flag":        {[]string{"demo", "--nope"}, "unknown flag"},
		"duration":    {[]string{"demo", "--duration", "soon"}, "invalid argument"},
		"positional":  {[]string{"demo", "extra"}, "unknown command"},
		"sweep input": {[]string{"demo", "--sweep", "--sweep-work", "-1s"}, "sweep"},
	} {
		code, stdout, stderr := runCLI(t, tc.args...)
		if code != exitBadInput {
			t.Errorf("%s: exit %d, want %d (stderr %q)", name, code, exitBadInput, stderr)
		}
		if !strings.HasPrefix(stderr, "spillway demo: ") || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%s: stderr %q, want one line naming %q", name, stderr, tc.want)
		}
		if stdout != "" {
			t.Errorf("%s: stdout %q", name, stdout)
		}
	}
}

// TestDemoJSON runs a tiny demo (the Spillway group only, no burst) and
// checks the JSON summary, the results file and the report.
func TestDemoJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an embedded Kafka broker")
	}
	dir := t.TempDir()
	report, results := filepath.Join(dir, "r.html"), filepath.Join(dir, "r.json")
	code, stdout, stderr := runCLI(t, "demo", "--groups", "spillway", "--duration", "2s", "--burst", "0",
		"--rate", "20", "--parcels", "4", "--vehicles", "10", "--drain", "10s", "--passes", "1",
		"--json", "--quiet", "--report", report, "--results", results)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var s struct {
		Version int `json:"version"`
		Stream  struct {
			Messages int `json:"messages"`
		} `json:"stream"`
		Calibration struct {
			Budget int64 `json:"budget"`
		} `json:"calibration"`
		Groups []struct {
			Name         string  `json:"name"`
			Messages     int     `json:"messages"`
			Processed    int     `json:"processed"`
			Unprocessed  int     `json:"unprocessed"`
			Duplicates   int     `json:"duplicates"`
			DrainSeconds float64 `json:"drain_seconds"`
			StartBudget  int64   `json:"start_budget"`
		} `json:"groups"`
		Report string `json:"report"`
	}
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatalf("stdout is not the JSON summary: %v\n%s", err, stdout)
	}
	if s.Version != 1 || len(s.Groups) != 1 || s.Groups[0].Name != "spillway" {
		t.Fatalf("summary: %+v", s)
	}
	g := s.Groups[0]
	if g.Messages != s.Stream.Messages || g.Messages != 40+8 || g.Unprocessed != 0 || g.Duplicates != 0 || g.DrainSeconds <= 0 {
		t.Errorf("group: %+v", g)
	}
	if g.StartBudget != s.Calibration.Budget || g.StartBudget <= 0 {
		t.Errorf("start budget %d, calibrated %d", g.StartBudget, s.Calibration.Budget)
	}
	if abs, _ := filepath.Abs(report); s.Report != abs {
		t.Errorf("report %q, want %q", s.Report, abs)
	}
	html, err := os.ReadFile(report)
	if err != nil || !strings.Contains(string(html), "<svg ") {
		t.Errorf("report: %v", err)
	}
	saved, err := os.ReadFile(results)
	if err != nil || string(saved) != stdout {
		t.Errorf("results file differs from stdout (%v)", err)
	}
	if stderr != "" {
		t.Errorf("--quiet printed %q", stderr)
	}
}
