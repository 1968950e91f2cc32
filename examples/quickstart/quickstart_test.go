package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestPageShowsTheCode: every code block of docs/quickstart.md marked
// <!-- file: PATH --> is exactly the repository's file at PATH, and the
// page shows both of the program's files, so the page cannot drift from
// the code that TestQuickstart runs.
func TestPageShowsTheCode(t *testing.T) {
	const root = "../.."
	page, err := os.ReadFile(filepath.Join(root, "docs", "quickstart.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)<!-- file: (\\S+) -->\n```[a-z]*\n(.*?)```\n").FindAllSubmatch(page, -1)
	shown := map[string]bool{}
	for _, b := range blocks {
		path := string(b[1])
		shown[path] = true
		file, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Errorf("docs/quickstart.md shows %s: %v", path, err)
			continue
		}
		if !bytes.Equal(b[2], file) {
			t.Errorf("docs/quickstart.md's block for %s differs from the file: copy the file into the page\n--- page\n%s--- file\n%s", path, b[2], file)
		}
	}
	for _, want := range []string{"examples/quickstart/main.go", "examples/quickstart/spillway.yaml"} {
		if !shown[want] {
			t.Errorf("docs/quickstart.md shows no block marked <!-- file: %s -->", want)
		}
	}
}

// TestQuickstart builds the program and runs it as the page does: on the
// embedded Kafka of spillway.yaml, then on a real redis-server through
// SPILLWAY_* variables alone. Each run publishes 20 samples, indexes every
// one, writes their traces to stderr and exits 0 by itself. A run that
// publishes nothing serves /metrics until it is interrupted, and then exits 0.
func TestQuickstart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the program")
	}
	bin := filepath.Join(t.TempDir(), "quickstart")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	t.Run("kafka", func(t *testing.T) { runSamples(t, bin) })
	t.Run("metrics", func(t *testing.T) { runMetrics(t, bin) })
	t.Run("redis", func(t *testing.T) {
		addr := startRedis(t)
		runSamples(t, bin, "SPILLWAY_BROKER=redis", "SPILLWAY_REDIS_ADDR="+addr)
	})
}

// command runs bin in this directory, where spillway.yaml is, with the
// environment's SPILLWAY_* variables replaced by env.
func command(ctx context.Context, bin string, args []string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SPILLWAY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func runSamples(t *testing.T, bin string, env ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := command(ctx, bin, []string{"-messages", "20", "-metrics-addr", "127.0.0.1:0"}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	indexed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if strings.HasPrefix(line, "[watermill]") {
			continue // the router's log
		}
		var id string
		var n int
		if _, err := fmt.Sscanf(line, "indexed %s %d vertices", &id, &n); err != nil {
			t.Errorf("unexpected line %q: %v", line, err)
			continue
		}
		want := "bbox [13.405 52.521 13.405 52.521]" // a position
		if n == 4 {
			want = "bbox [13.4 52.52 13.41 52.53]" // a parcel
		}
		if !strings.HasSuffix(line, want) {
			t.Errorf("line %q does not end in %q", line, want)
		}
		indexed[strings.TrimSuffix(id, ":")] = true
	}
	for i := range 20 {
		if id := fmt.Sprintf("sample-%d", i); !indexed[id] {
			t.Errorf("%s not indexed; stdout:\n%s", id, stdout.String())
		}
	}
	for _, span := range []string{`"Name":"send parcels"`, `"Name":"process parcels"`} {
		if got := strings.Count(stderr.String(), span); got < 20 {
			t.Errorf("stderr has %d spans %s, want a trace of every sample", got, span)
		}
	}
}

func runMetrics(t *testing.T, bin string) {
	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := command(ctx, bin, []string{"-messages", "0", "-metrics-addr", addr})
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	const want = `spillway_budget_capacity{budget="spillway"`
	var body string
	for deadline := time.Now().Add(time.Minute); !strings.Contains(body, want); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			cancel() // kills it
			<-exited
			t.Fatalf("http://%s/metrics has no %s after a minute:\n%s\noutput:\n%s", addr, want, body, output.String())
		}
		if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after an interrupt: %v\noutput:\n%s", err, output.String())
		}
	case <-time.After(time.Minute):
		cancel()
		<-exited
		t.Errorf("still running a minute after an interrupt; output:\n%s", output.String())
	}
}

// freeAddr is a loopback address nothing listens on right now.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startRedis runs a redis-server without persistence on a free port until
// the test ends. Without one installed the test is skipped, unless
// SPILLWAY_REQUIRE_REDIS=1 (CI) makes that a failure.
func startRedis(t *testing.T) string {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("SPILLWAY_REQUIRE_REDIS") == "1" {
			t.Fatal("redis-server not installed and SPILLWAY_REQUIRE_REDIS=1:", err)
		}
		t.Skip("redis-server not installed (make deps installs it):", err)
	}
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	logFile := filepath.Join(dir, "redis.log")
	srv := exec.Command(path, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", logFile)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile)
			t.Fatalf("redis-server did not listen on %s within 20s:\n%s", addr, log)
		}
	}
}
