// Package kafkatest runs a Kafka broker for the library's tests as a
// process of its own: the embedded kfake broker of command
// github.com/spillway-go/spillway/embedded/cmd/spillway-kafka, built from
// the repository's go.work workspace. The library module itself never links
// kfake, so a user's module graph does not include it; its tests reach a
// real Kafka wire-protocol broker over loopback, exactly as they would an
// external cluster, and can kill it.
//
// Outside the workspace (the module read from a module cache, or
// GOWORK=off) the broker cannot be built: tests that need it are skipped,
// or fail when SPILLWAY_REQUIRE_KAFKA=1 (CI sets it).
package kafkatest

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

// EnvRequire makes a missing broker a test failure rather than a skip.
const EnvRequire = "SPILLWAY_REQUIRE_KAFKA"

// Command is the package built and run as the broker.
const Command = "github.com/spillway-go/spillway/embedded/cmd/spillway-kafka"

// Broker is a running broker process.
type Broker struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser // held open: the broker exits when it closes
	brokers []string
	once    sync.Once
}

var build struct {
	once sync.Once
	path string
	err  error
}

// binary builds the broker once per test binary, into a directory of the
// system's temporary directory shared by test binaries; the build cache
// makes every build after the first a link, and the rename is atomic.
func binary() (string, error) {
	build.once.Do(func() {
		dir := filepath.Join(os.TempDir(), "spillway-kafkatest")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			build.err = err
			return
		}
		tmp, err := os.CreateTemp(dir, "build-*")
		if err != nil {
			build.err = err
			return
		}
		tmp.Close()
		cmd := exec.Command("go", "build", "-o", tmp.Name(), Command)
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp.Name())
			build.err = fmt.Errorf("go build %s: %v: %s", Command, err, strings.TrimSpace(string(out)))
			return
		}
		build.path = filepath.Join(dir, "spillway-kafka")
		if err := os.Rename(tmp.Name(), build.path); err != nil {
			os.Remove(tmp.Name())
			build.err = err
		}
	})
	return build.path, build.err
}

// Start runs a broker whose topics have partitions partitions, creating
// topics up front, and stops it (kill -9) when the test and its subtests
// finish. It skips the test, or fails it when SPILLWAY_REQUIRE_KAFKA=1, if
// the broker cannot be built.
func Start(t testing.TB, partitions int32, topics ...string) *Broker {
	t.Helper()
	b, err := Launch(partitions, topics...)
	if err != nil {
		if errors.Is(err, ErrUnavailable) && os.Getenv(EnvRequire) != "1" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(b.Kill)
	return b
}

// ErrUnavailable is returned by [Launch] when the broker cannot be built.
var ErrUnavailable = errors.New("kafkatest: the embedded broker cannot be built here (it needs the repository's go.work)")

// Launch is [Start] without a test: the caller must call Kill. It fits
// embedreg.RegisterKafka through [Embedded].
func Launch(partitions int32, topics ...string) (*Broker, error) {
	path, err := binary()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	cmd := exec.Command(path, "-stdin", "-partitions", strconv.Itoa(int(partitions)), "-topics", strings.Join(topics, ","))
	// The broker dies with this process, however it ends: its standard
	// input closes, and the kernel kills it when its parent thread exits.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// The broker's stdout is a pipe file of our own rather than
	// StdoutPipe, so no goroutine is left copying it (goleak-clean): the
	// first line is read, then the read end is closed.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("kafkatest: %w", err)
	}
	b := &Broker{cmd: cmd, stdin: stdin}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(r).ReadString('\n')
		line <- strings.TrimSpace(l)
	}()
	var first string
	select {
	case first = <-line:
	case <-time.After(30 * time.Second):
		b.Kill()
		first = <-line
	}
	r.Close()
	addrs, found := strings.CutPrefix(first, "brokers ")
	if !found || addrs == "" {
		b.Kill()
		return nil, fmt.Errorf("kafkatest: broker did not start (first line %q)", first)
	}
	b.brokers = strings.Split(addrs, ",")
	return b, nil
}

// Brokers returns the bootstrap addresses.
func (b *Broker) Brokers() []string { return append([]string(nil), b.brokers...) }

// Kill ends the broker with SIGKILL and waits for it. Safe to call twice.
func (b *Broker) Kill() {
	b.once.Do(func() {
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
		_ = b.stdin.Close()
	})
}

// Embedded starts a broker process; it has the shape of
// embedreg.KafkaFunc, so a test package can register it for
// kafka.brokers "embedded":
//
//	func init() { embedreg.RegisterKafka(kafkatest.Embedded) }
func Embedded(partitions int32, topics []string) ([]string, func(), error) {
	b, err := Launch(partitions, topics...)
	if err != nil {
		return nil, nil, err
	}
	return b.Brokers(), b.Kill, nil
}
