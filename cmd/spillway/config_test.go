package main

import (
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/router"
)

// clearSpillwayEnv unsets every SPILLWAY_ variable for the test.
func clearSpillwayEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "SPILLWAY_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

// TestConfigPrint: defaults filled in, anchors and merge keys resolved,
// the environment winning over the file, secrets redacted, and every value
// followed by its source.
func TestConfigPrint(t *testing.T) {
	clearSpillwayEnv(t)
	t.Setenv("SPILLWAY_REDIS_MAX_IDLE_TIME", "45s")
	t.Setenv("SPILLWAY_BUDGET_VERTICES", "50000")
	t.Setenv("SPILLWAY_REDIS_PASSWORD", "from-env")
	t.Setenv("SPILLWAY_REQUIRE_REDIS", "1") // the test harness's, not a field
	code, stdout, stderr := runCLI(t, "config", "print", "testdata/config-anchors.yaml")
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	checkGolden(t, "config-print.golden", stdout)
	for _, secret := range []string{"from-env", "from-file"} {
		if strings.Contains(stdout, secret) {
			t.Errorf("secret %q printed", secret)
		}
	}
	for _, want := range []string{
		"  password: '[redacted]' # from env SPILLWAY_REDIS_PASSWORD\n",
		"    server_name: kafka.internal # from testdata/config-anchors.yaml:18\n", // written beside the merge key
		"    ca_file: /etc/ssl/ca.pem # from testdata/config-anchors.yaml:9\n",     // merged from the anchor
		"  vertices: 50000 # from env SPILLWAY_BUDGET_VERTICES\n",
		"  max_idle_time: 45s # from env SPILLWAY_REDIS_MAX_IDLE_TIME\n",
		"  rebalance_timeout: 1m0s # default\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// Every line holding a value names a source.
	for _, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "- ") || strings.HasSuffix(line, ":") ||
			strings.HasPrefix(strings.TrimSpace(line), "positions: ") {
			continue // a list element, a section, an entry of max_len
		}
		if !strings.Contains(line, " # from ") && !strings.HasSuffix(line, " # default") {
			t.Errorf("no source: %q", line)
		}
	}
}

// TestConfigPrintLanes: each lane shows the weight it runs with (1 when
// not set, not 0) and each of its keys its own source.
func TestConfigPrintLanes(t *testing.T) {
	clearSpillwayEnv(t)
	code, stdout, stderr := runCLI(t, "config", "print", "testdata/config-lanes.yaml")
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{
		"  lanes: # from testdata/config-lanes.yaml:4\n" +
			"    - name: fast # from testdata/config-lanes.yaml:4\n" +
			"      weight: 1 # default\n" +
			"      reserve: 0.1 # from testdata/config-lanes.yaml:4\n",
		"    - name: rest # from testdata/config-lanes.yaml:5\n" +
			"      weight: 3 # from testdata/config-lanes.yaml:6\n" +
			"      reserve: 0 # default\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks\n%s\ngot:\n%s", want, stdout)
		}
	}
	// What it prints loads again as the same configuration.
	again := filepath.Join(t.TempDir(), "printed.yaml")
	if err := os.WriteFile(again, []byte(stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI(t, "config", "check", again); code != exitOK {
		t.Errorf("printed config: exit %d, stderr %q", code, stderr)
	}
}

func TestConfigCheck(t *testing.T) {
	clearSpillwayEnv(t)
	code, stdout, stderr := runCLI(t, "config", "check", "testdata/config-anchors.yaml")
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if want := "ok\nbroker: redis\nredelivery deadline: 30s (redis.max_idle_time)\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
	t.Setenv("SPILLWAY_BROKER", "memory")
	if _, stdout, _ = runCLI(t, "config", "check", "testdata/config-anchors.yaml"); !strings.Contains(stdout, "redelivery deadline: none") {
		t.Errorf("memory: %q", stdout)
	}
	t.Setenv("SPILLWAY_BROKER", "custom")
	if code, stdout, _ := runCLI(t, "config", "check", "testdata/config-anchors.yaml"); code != exitOK ||
		!strings.Contains(stdout, "broker: custom\nredelivery deadline: set in code (router.WithBroker)") {
		t.Errorf("custom: exit %d, %q", code, stdout)
	}
}

// TestConfigCheckProblems: each problem on its own line, with the field,
// where it was set, the reason and the value, and exit code 2.
func TestConfigCheckProblems(t *testing.T) {
	for _, tt := range []struct {
		name, file string
		env        map[string]string
	}{
		{"invalid", "config-invalid.yaml", map[string]string{"SPILLWAY_KAFKA_HEARTBEAT_INTERVAL": "2m"}},
		{"unreadable", "config-unreadable.yaml", nil},
		{"unknown-env", "config-anchors.yaml", map[string]string{"SPILLWAY_KAFKA_BROKER": "k:9092", "SPILLWAY_REDIS_PASWORD": "x"}},
		{"typos", "config-typos.yaml", nil}, // every unknown key, with its line and the closest known one
	} {
		t.Run(tt.name, func(t *testing.T) {
			clearSpillwayEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			for _, sub := range []string{"check", "print"} {
				code, stdout, stderr := runCLI(t, "config", sub, "testdata/"+tt.file)
				if code != exitBadInput || stdout != "" {
					t.Errorf("%s: exit %d, stdout %q", sub, code, stdout)
				}
				if sub == "check" {
					checkGolden(t, "config-check-"+tt.name+".golden", stderr)
				}
				for _, line := range strings.Split(strings.TrimSuffix(stderr, "\n"), "\n") {
					if !strings.HasPrefix(line, "spillway config "+sub+": ") {
						t.Errorf("%s: line without the command: %q", sub, line)
					}
				}
			}
		})
	}
}

func TestVersion(t *testing.T) {
	code, stdout, stderr := runCLI(t, "--version")
	if code != exitOK || stderr != "" || !strings.HasPrefix(stdout, "spillway ") || strings.Count(stdout, "\n") != 1 {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/spillway-go/spillway/cmd", Version: "v0.4.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.time", Value: "2026-11-30T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	if got, want := version(bi, true), "v0.4.0 (revision 0123abcd, 2026-11-30T10:00:00Z, modified)"; got != want {
		t.Errorf("version = %q, want %q", got, want)
	}
	bi.Settings = bi.Settings[:1]
	if got, want := version(bi, true), "v0.4.0 (revision 0123abcd)"; got != want {
		t.Errorf("version = %q, want %q", got, want)
	}
	bi.GoVersion = "go1.26.8"
	if got, want := version(bi, true), "v0.4.0 (revision 0123abcd) go1.26.8"; got != want {
		t.Errorf("version = %q, want %q", got, want)
	}
	// A released build without VCS stamps (go install ...@v0.4.0): the
	// version says it all.
	if got, want := version(&debug.BuildInfo{Main: debug.Module{Version: "v0.4.0"}}, true), "v0.4.0"; got != want {
		t.Errorf("version = %q, want %q", got, want)
	}
	// A development build without a revision (go run, -buildvcs=false)
	// says how to get one.
	got := version(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, GoVersion: "go1.26.8"}, true)
	if !strings.HasPrefix(got, "(devel) (no VCS revision: ") || !strings.Contains(got, "go install ./cmd/spillway in a git clone") || !strings.HasSuffix(got, " go1.26.8") {
		t.Errorf("version without VCS stamps = %q", got)
	}
	if got := version(&debug.BuildInfo{}, true); !strings.HasPrefix(got, "(devel) (no VCS revision") {
		t.Errorf("version of empty build info = %q", got)
	}
	if got := version(nil, false); !strings.Contains(got, "unknown") {
		t.Errorf("version without build info = %q", got)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// TestExitCodes: the exit code follows the error's type: cobra's own
// command-line errors and the commands' input errors are 2, the rest 1.
func TestExitCodes(t *testing.T) {
	clearSpillwayEnv(t)
	for _, tt := range []struct {
		name string
		args []string
		want int
		msg  string // in stderr
	}{
		{"help", []string{}, exitOK, ""},
		{"config help", []string{"config"}, exitOK, ""},
		{"unknown command", []string{"grow"}, exitBadInput, `unknown command "grow" for "spillway"`},
		{"unknown command suggestion", []string{"sise"}, exitBadInput, "did you mean size?"},
		{"unknown subcommand", []string{"config", "lint"}, exitBadInput, `unknown command "lint" for "spillway config"`},
		{"unknown flag", []string{"config", "check", "--strict", "f.yaml"}, exitBadInput, "unknown flag: --strict"},
		{"unknown shorthand", []string{"size", "-z"}, exitBadInput, "unknown shorthand flag"},
		{"bad flag value", []string{"size", "--repeats", "many"}, exitBadInput, "invalid argument"},
		{"no file", []string{"config", "check"}, exitBadInput, "accepts 1 arg(s), received 0"},
		{"two files", []string{"config", "print", "a.yaml", "b.yaml"}, exitBadInput, "accepts 1 arg(s), received 2"},
		{"stray argument", []string{"demo", "now"}, exitBadInput, `unknown command "now"`},
		{"missing file", []string{"config", "check", "testdata/nope.yaml"}, exitBadInput, "no such file"},
		{"invalid config", []string{"config", "check", "testdata/config-invalid.yaml"}, exitBadInput, "budget.vertices"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tt.args...)
			if code != tt.want || !strings.Contains(stderr, tt.msg) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr, tt.want, tt.msg)
			}
		})
	}
	// An output that cannot be written is a failure, not bad input.
	var errOut strings.Builder
	if code := run([]string{"config", "check", "testdata/config-anchors.yaml"}, &env{stdout: failingWriter{}, stderr: &errOut}); code != exitFailure ||
		!strings.Contains(errOut.String(), "disk full") {
		t.Errorf("failing stdout: exit %d, stderr %q", code, errOut.String())
	}
	// The help documents the codes.
	if _, stdout, _ := runCLI(t, "--help"); !strings.Contains(stdout, "Exit codes:") || !strings.Contains(stdout, "2  bad input") {
		t.Errorf("help lacks the exit codes:\n%s", stdout)
	}
}

// effective fills what router.New works out from other fields, so that
// config print shows the values the router runs with, and the result still
// validates.
func TestEffective(t *testing.T) {
	c := router.Config{Broker: "kafka"}
	c.Kafka.Brokers = []string{"k:9092"}
	c.Kafka.RebalanceTimeout = 40 * time.Second
	c.Budget.Lanes = []middleware.Lane{{Name: "fast", MaxCharge: 10}, {Name: "rest", Weight: 3}}
	c.Budget.AutoSize.MemoryBytes = 1 << 30
	c.Budget.AutoSize.BytesPerVertex = 1024
	c.Budget.AutoSize.Processes = 1 // as loaded: LoadConfig fills the defaults
	e := effective(c)
	if w := []int64{e.Budget.Lanes[0].Weight, e.Budget.Lanes[1].Weight}; w[0] != 1 || w[1] != 3 {
		t.Errorf("lane weights %v, want [1 3]", w)
	}
	if c.Budget.Lanes[0].Weight != 0 {
		t.Error("effective changed the caller's lanes")
	}
	a := e.Budget.AutoSize
	if a.Deadline != 40*time.Second || a.Window != 40*time.Second || a.MinBusy != 2*time.Second {
		t.Errorf("autosize deadline %v window %v min_busy %v, want 40s 40s 2s", a.Deadline, a.Window, a.MinBusy)
	}
	if a.MemoryBound != 0 || a.Ceiling != 1<<20 { // memory_bound stays unset: memory_bytes gives it
		t.Errorf("autosize memory_bound %d ceiling %d, want 0 %d", a.MemoryBound, a.Ceiling, 1<<20)
	}
	if err := e.Validate(); err != nil {
		t.Errorf("the effective config does not validate: %v", err)
	}
	c.Budget.AutoSize.Window = 10 * time.Second
	if a := effective(c).Budget.AutoSize; a.Window != 10*time.Second || a.MinBusy != 500*time.Millisecond {
		t.Errorf("set window: window %v min_busy %v, want 10s 500ms", a.Window, a.MinBusy)
	}
}
