// Package kafkaproc runs the embedded Kafka broker (kfake) of the CLI's
// benchmarks in a child process of the running executable, so that the
// CPU and heap measured in the parent are the consumers' alone.
//
// The parent calls [Start]; the child is the same executable started with
// an environment variable set, which [ServeIfAsked], called first thing in
// main (and in TestMain of a test binary that starts a broker), turns into
// a broker.
package kafkaproc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-go/spillway/embedded"
)

// childEnv carries the child broker's partitions and topics,
// "<partitions>:<topic>,<topic>...". A process started with it set serves
// a kfake broker instead of doing anything else ([ServeIfAsked]).
const childEnv = "SPILLWAY_BENCH_KAFKA_CHILD"

// ServeIfAsked runs the embedded Kafka broker when this process was
// started as one by [Start], and returns true when it has finished; it
// returns false at once otherwise. Call it first thing in main, and in
// TestMain of a test binary that starts a broker.
func ServeIfAsked() bool {
	spec, ok := os.LookupEnv(childEnv)
	if !ok {
		return false
	}
	parts, topics, _ := strings.Cut(spec, ":")
	p, err := strconv.Atoi(parts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "spillway bench broker:", err)
		os.Exit(1)
	}
	k, err := embedded.StartKafka(int32(p), strings.Split(topics, ",")...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "spillway bench broker:", err)
		os.Exit(1)
	}
	fmt.Println("brokers", strings.Join(k.Brokers(), ","))
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it or dies
	k.Close()
	return true
}

// Broker is a kfake broker in a child process. Close stops it.
type Broker struct {
	// Brokers are its bootstrap addresses.
	Brokers []string

	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// Start runs a broker with topics of partitions partitions each in a
// child process of this executable, and waits up to 30 s for it to listen.
func Start(partitions int, topics []string) (*Broker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("kafkaproc: finding this executable to run the broker: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(partitions)+":"+strings.Join(topics, ","))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("kafkaproc: starting the Kafka broker process: %w", err)
	}
	b := &Broker{cmd: cmd, stdin: stdin}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(l)
		_, _ = io.Copy(io.Discard, out)
	}()
	var first string
	select {
	case first = <-line:
	case <-time.After(30 * time.Second):
	}
	addrs, found := strings.CutPrefix(first, "brokers ")
	if !found || addrs == "" {
		b.Close()
		return nil, fmt.Errorf("kafkaproc: the Kafka broker process did not start (first line %q)", first)
	}
	b.Brokers = strings.Split(addrs, ",")
	return b, nil
}

// Pid is the broker process's id.
func (b *Broker) Pid() int { return b.cmd.Process.Pid }

// Close stops the broker: it closes its stdin and kills it if it has not
// exited 5 s later.
func (b *Broker) Close() {
	_ = b.stdin.Close()
	done := make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = b.cmd.Process.Kill()
		<-done
	}
}
