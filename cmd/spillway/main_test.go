package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// runCLI runs the command line in-process and returns the exit code and
// what it printed.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &env{stdout: &out, stderr: &errOut})
	return code, out.String(), errOut.String()
}

// ring returns a GeoJSON Feature line: a polygon whose ring has n
// vertices, the last closing it, on a circle around (cx, 0).
func ring(n int, cx float64) string {
	var b strings.Builder
	b.WriteString(`{"type":"Feature","properties":{"name":"r"},"geometry":{"type":"Polygon","coordinates":[[`)
	for i := range n - 1 {
		a := 2 * math.Pi * float64(i) / float64(n-1)
		fmt.Fprintf(&b, "[%.6f,%.6f],", cx+math.Cos(a), math.Sin(a))
	}
	fmt.Fprintf(&b, "[%.6f,%.6f]]]}}", cx+1, 0.0)
	return b.String()
}

// writeSample writes a small sample: light rings of 5 to 12 vertices and a
// few heavy ones of 200.
func writeSample(t *testing.T) string {
	t.Helper()
	var lines []string
	for i := range 40 {
		lines = append(lines, ring(5+i%8, float64(i)))
	}
	for i := range 4 {
		lines = append(lines, ring(200, float64(100+i)))
	}
	return writeFile(t, "sample.ndjson", strings.Join(lines, "\n")+"\n")
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// shape describes a decoded JSON value by its structure only: object keys
// (sorted) with the shapes of their values, the shape of an array's
// elements, and the type of every scalar.
func shape(v any, indent string) string {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		b.WriteString("{\n")
		for _, k := range keys {
			fmt.Fprintf(&b, "%s  %s: %s\n", indent, k, shape(v[k], indent+"  "))
		}
		b.WriteString(indent + "}")
		return b.String()
	case []any:
		if len(v) == 0 {
			return "[]"
		}
		return "[" + shape(v[0], indent) + "]"
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("JSON shape changed; if on purpose, run go test -update.\ngot:\n%s\nwant:\n%s", got, want)
	}
}

// The --json output's field names and types are a contract; the measured
// values are not, so the golden file holds the shape only.
func TestSizeJSONShape(t *testing.T) {
	sample := writeSample(t)
	chart := filepath.Join(t.TempDir(), "chart.svg")
	for _, tt := range []struct {
		golden string
		args   []string
	}{
		{"size-json.golden", nil},
		{"size-json-chart.golden", []string{"--chart", chart, "--heavy-above", "100"}},
	} {
		t.Run(tt.golden, func(t *testing.T) {
			args := append([]string{"size", "--sample", sample, "--json", "--repeats", "1", "--memory", "1GiB", "--deadline", "30s"}, tt.args...)
			code, stdout, stderr := runCLI(t, args...)
			if code != exitOK || stderr != "" {
				t.Fatalf("exit %d, stderr %q", code, stderr)
			}
			var v map[string]any
			if err := json.Unmarshal([]byte(stdout), &v); err != nil {
				t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
			}
			checkGolden(t, tt.golden, shape(v, "")+"\n")

			// A few values that follow from the input, not the machine.
			sampleV := v["sample"].(map[string]any)
			if sampleV["geometries"].(float64) != 44 || sampleV["vertices"].(float64) != 40*8.5+800 {
				t.Errorf("sample %v", sampleV)
			}
			in := v["inputs"].(map[string]any)
			if in["memory_bytes"].(float64) != 1<<30 || in["deadline_seconds"].(float64) != 30 || in["headroom"].(float64) != 0.5 {
				t.Errorf("inputs %v", in)
			}
			budget, mb, db := v["budget"].(float64), v["memory_bound"].(float64), v["deadline_bound"].(float64)
			if budget != min(mb, db) || (v["binding"] == "memory") != (mb <= db) {
				t.Errorf("budget %v, binding %v, bounds %v/%v", budget, v["binding"], mb, db)
			}
		})
	}
	b, err := os.ReadFile(chart)
	if err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("crossover")) && !bytes.Contains(b, []byte("deadline bound")) {
		t.Fatalf("chart: %v, %d bytes", err, len(b))
	}
}

func TestSizeHumanOutput(t *testing.T) {
	sample := writeSample(t)
	code, stdout, stderr := runCLI(t, "size", "--sample", sample, "--repeats", "1", "--memory", "64MiB", "--deadline", "10m")
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	// 64 MiB and a 10 minute deadline: memory binds on any machine.
	for _, want := range []string{"bytes per vertex", "vertices per second", "memory bound", "deadline bound",
		"budget", "<- binds", "Memory binds"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	for _, line := range strings.Split(stdout, "\n") {
		if strings.HasSuffix(line, " ") {
			t.Errorf("trailing space: %q", line)
		}
		if strings.Contains(line, "memory bound") && !strings.Contains(line, "<- binds") {
			t.Errorf("memory should bind: %q", line)
		}
	}
}

func TestSizeBadInput(t *testing.T) {
	sample := writeSample(t)
	dir := t.TempDir()
	chart := filepath.Join(dir, "chart.svg")
	badLine := writeFile(t, "bad.ndjson", ring(5, 0)+"\n\n"+`{"type":"Feature","properties":{}}`+"\n")
	notJSON := writeFile(t, "text.ndjson", ring(5, 0)+"\nhello world\n")
	empty := writeFile(t, "empty.ndjson", "\n\n")
	light := writeFile(t, "light.ndjson", ring(5, 0)+"\n"+ring(6, 1)+"\n")

	tests := []struct {
		name string
		args []string
		want string // in the one line on stderr
	}{
		{"no sample", []string{"size"}, "--sample is required"},
		{"missing file", []string{"size", "--sample", filepath.Join(dir, "nope.ndjson")}, "no such file"},
		{"directory", []string{"size", "--sample", dir}, "is a directory"},
		{"line not a geometry", []string{"size", "--sample", badLine}, "bad.ndjson: sample line 3 is not a geometry"},
		{"line not JSON", []string{"size", "--sample", notJSON}, "text.ndjson: sample line 2 is not a geometry"},
		{"empty sample", []string{"size", "--sample", empty}, "empty sample"},
		{"zero memory", []string{"size", "--sample", sample, "--memory", "0"}, "--memory must be positive"},
		{"negative memory", []string{"size", "--sample", sample, "--memory", "-1GiB"}, "--memory must be positive"},
		{"memory not a size", []string{"size", "--sample", sample, "--memory", "lots"}, `"lots"`},
		{"zero deadline", []string{"size", "--sample", sample, "--deadline", "0s"}, "--deadline must be positive"},
		{"negative deadline", []string{"size", "--sample", sample, "--deadline", "-5s"}, "--deadline must be positive"},
		{"deadline not a duration", []string{"size", "--sample", sample, "--deadline", "soon"}, "soon"},
		{"zero processes", []string{"size", "--sample", sample, "--processes", "0"}, "--processes must be positive"},
		{"unknown handler", []string{"size", "--sample", sample, "--handler", "magic"}, `--handler "magic"`},
		{"bad headroom", []string{"size", "--sample", sample, "--headroom", "1.5"}, "--headroom"},
		{"prefetch eats memory", []string{"size", "--sample", sample, "--memory", "1MiB", "--prefetch", "2MiB",
			"--repeats", "1", "--chart", chart, "--heavy-above", "100"}, "prefetch"},
		{"no heavy geometry", []string{"size", "--sample", light, "--chart", chart}, "--heavy-above 1000: no geometry"},
		{"chart directory missing", []string{"size", "--sample", sample, "--chart", filepath.Join(dir, "no", "c.svg"),
			"--heavy-above", "100"}, "--chart"},
		{"unknown flag", []string{"size", "--sample", sample, "--colour"}, "unknown flag"},
		{"stray argument", []string{"size", "--sample", sample, "extra"}, "extra"},
		{"unknown command", []string{"grow"}, "unknown command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tt.args...)
			if code != exitBadInput {
				t.Errorf("exit %d, want %d (stderr %q)", code, exitBadInput, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "spillway") || !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr %q, want one line mentioning %q", stderr, tt.want)
			}
			if tt.args[0] == "size" && !strings.HasPrefix(stderr, "spillway size: ") {
				t.Errorf("stderr %q does not start with the command", stderr)
			}
		})
	}
	// No chart, not even a partial one or a temporary file.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left behind in the chart directory: %s", e.Name())
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"1024": 1024, "2GiB": 2 << 30, "2Gi": 2 << 30, "1.5MiB": 3 << 19, "512 KiB": 512 << 10,
		"1GB": 1e9, "1G": 1e9, "10k": 10_000, "3b": 3, "0": 0, "-1GiB": -(1 << 30),
	} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "lots", "2 parsecs", "1e400"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) did not fail", in)
		}
	}
}
