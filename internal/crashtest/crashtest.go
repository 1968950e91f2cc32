// Package crashtest runs Spillway consumers as separate OS processes for
// fault-injection tests: a test starts consumers (command
// internal/crashtest/consumer) against a broker it owns, kills one with
// SIGKILL or stops it with SIGTERM mid-burst, and then reads the journals
// the consumers wrote to account for every message.
//
// Each consumer journals "S id vertices" when its handler starts a message
// (the budget has admitted it) and "D id" when the handler finishes it. A
// message finished by two processes, or twice by one, is a duplicate; the
// tests check that duplicates only come from messages a killed process had
// started, and that nothing published goes unaccounted.
//
// A consumer's standard error (Watermill's info and error logs) is shown,
// its tail, when a test fails; CRASHTEST_DEBUG=1 adds its debug logs.
package crashtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Command is the package built and run as a consumer process.
const Command = "github.com/spillway-go/spillway/internal/crashtest/consumer"

var build struct {
	once sync.Once
	path string
	err  error
}

// binary builds the consumer once per test binary.
func binary() (string, error) {
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "spillway-crashtest-")
		if err != nil {
			build.err = err
			return
		}
		path := filepath.Join(dir, "consumer")
		cmd := exec.Command("go", "build", "-o", path, Command)
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build %s: %v: %s", Command, err, strings.TrimSpace(string(out)))
			return
		}
		build.path = path
	})
	return build.path, build.err
}

// Options describe one consumer process.
type Options struct {
	Config    string        // router config, YAML text
	Topic     string        // the topic its one handler consumes
	Journal   string        // journal file; a restarted consumer may reuse one
	PerVertex time.Duration // handler time per vertex of the message
	FailOn    string        // the handler fails messages whose payload contains it
	Output    string        // a topic the handler publishes one message to per message
	Decode    bool          // the handler decodes payloads and fails those it cannot
	Env       []string      // extra environment (SPILLWAY_* overrides)
}

// Consumer is a running consumer process.
type Consumer struct {
	t       testing.TB
	cmd     *exec.Cmd
	opts    Options
	exited  chan struct{}
	waitErr error
	stderr  *tailBuffer
}

// Start builds the consumer if needed, starts it and waits until its router
// runs. The process is killed when the test ends, if it still runs.
func Start(t testing.TB, opts Options) *Consumer {
	t.Helper()
	path, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "spillway.yaml")
	if err := os.WriteFile(cfgPath, []byte(opts.Config), 0o644); err != nil {
		t.Fatal(err)
	}
	if opts.Journal == "" {
		opts.Journal = filepath.Join(dir, "journal")
	}
	args := []string{"-config", cfgPath, "-topic", opts.Topic, "-journal", opts.Journal,
		"-per-vertex", opts.PerVertex.String()}
	if opts.FailOn != "" {
		args = append(args, "-fail-on", opts.FailOn)
	}
	if opts.Decode {
		args = append(args, "-decode")
	}
	if opts.Output != "" {
		args = append(args, "-output", opts.Output)
	}
	if os.Getenv("CRASHTEST_DEBUG") == "1" {
		args = append(args, "-v")
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), opts.Env...)
	// Dies with the test binary however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &Consumer{t: t, cmd: cmd, opts: opts, exited: make(chan struct{}), stderr: &tailBuffer{max: 64 << 10}}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
		if t.Failed() {
			t.Logf("consumer %d stderr (tail):\n%s", cmd.Process.Pid, c.stderr.String())
		}
	})
	select {
	case <-ready:
	case <-c.exited:
		t.Fatalf("consumer exited before it was ready: %v\n%s", c.waitErr, c.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("consumer not ready after 60s\n%s", c.stderr.String())
	}
	return c
}

// Pid is the process id.
func (c *Consumer) Pid() int { return c.cmd.Process.Pid }

// JournalPath is the consumer's journal file.
func (c *Consumer) JournalPath() string { return c.opts.Journal }

// Kill sends SIGKILL and waits for the process to be gone.
func (c *Consumer) Kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

// Terminate sends SIGTERM and waits up to timeout for the process to exit;
// it returns the process's error (nil for exit status 0).
func (c *Consumer) Terminate(timeout time.Duration) error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		if c.waitErr != nil {
			return fmt.Errorf("%w\n%s", c.waitErr, c.stderr.String())
		}
		return nil
	case <-time.After(timeout):
		return errors.New("crashtest: consumer still running after SIGTERM")
	}
}

// Journal is what one consumer's journal file says.
type Journal struct {
	Started  map[string]int // id → times started
	Done     map[string]int // id → times finished
	Failed   map[string]int // id → times failed on purpose
	Vertices map[string]int64
	PeakHeap uint64 // the largest live heap sampled, bytes
}

// ReadJournal parses a journal file; a missing file is an empty journal.
// A last line cut short by a kill is ignored.
func ReadJournal(path string) (Journal, error) {
	j := Journal{Started: map[string]int{}, Done: map[string]int{}, Failed: map[string]int{}, Vertices: map[string]int64{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return j, nil
	}
	if err != nil {
		return j, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "S":
			j.Started[f[1]]++
			n, _ := strconv.ParseInt(f[2], 10, 64)
			j.Vertices[f[1]] = n
		case len(f) == 2 && f[0] == "D":
			j.Done[f[1]]++
		case len(f) == 2 && f[0] == "F":
			j.Failed[f[1]]++
		case len(f) == 2 && f[0] == "H":
			if n, err := strconv.ParseUint(f[1], 10, 64); err == nil && n > j.PeakHeap {
				j.PeakHeap = n
			}
		}
	}
	return j, nil
}

// Journal reads this consumer's journal.
func (c *Consumer) Journal() Journal {
	c.t.Helper()
	j, err := ReadJournal(c.opts.Journal)
	if err != nil {
		c.t.Fatal(err)
	}
	return j
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
