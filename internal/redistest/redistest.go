// Package redistest runs a real redis-server for tests: on a free loopback
// port, in the test's temporary directory, stopped when the test ends.
//
// Tests that need Redis call [Start]. When redis-server is not installed the
// test is skipped with a message, unless the environment variable
// SPILLWAY_REQUIRE_REDIS is "1", in which case it fails: CI sets it so a
// missing server can never turn the Redis tests into silent skips. The
// project's .ci/deps.sh installs Debian's redis-server.
//
// A Server can be killed with SIGKILL ([Server.Kill]) and started again on
// the same port and directory ([Server.Restart]); with [WithAOF] the restarted
// server replays its append-only file, fsynced on every write, so everything
// a client saw acknowledged survives the kill.
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
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

// EnvRequire is the environment variable that turns a missing redis-server
// from a skip into a failure.
const EnvRequire = "SPILLWAY_REQUIRE_REDIS"

// Binary is the server executable looked up in PATH.
const Binary = "redis-server"

// startTimeout bounds how long a start or restart may take before the test
// fails. Generous: the machine is shared with other test runs.
const startTimeout = 20 * time.Second

// Option configures a [Server].
type Option func(*options)

type options struct {
	aof      bool
	password string
	tls      *TLSFiles
	args     []string
}

// WithAOF turns on the append-only file with appendfsync always, so a
// [Server.Restart] after a [Server.Kill] loses no acknowledged write.
func WithAOF() Option { return func(o *options) { o.aof = true } }

// WithPassword makes the server require AUTH with password (default user).
func WithPassword(password string) Option { return func(o *options) { o.password = password } }

// WithTLS serves TLS only (the plain port is disabled) with the given
// server certificate, requiring client certificates signed by files.CA when
// files.ClientAuth is set.
func WithTLS(files TLSFiles) Option { return func(o *options) { f := files; o.tls = &f } }

// WithArgs appends raw redis-server arguments, for example "--maxclients", "64".
func WithArgs(args ...string) Option { return func(o *options) { o.args = append(o.args, args...) } }

// TLSFiles names PEM files for a TLS server and its clients; see
// [GenerateTLS].
type TLSFiles struct {
	CA         string // the CA that signed both certificates
	Cert, Key  string // the server's certificate (for 127.0.0.1) and key
	ClientCert string // a client certificate signed by CA
	ClientKey  string
	ClientAuth bool // the server requires a client certificate
}

// Server is a redis-server process owned by one test. Its methods are safe
// for concurrent use; Kill and Restart must not race with each other in a
// way that matters to the test (the test decides the order).
type Server struct {
	t    testing.TB
	dir  string
	port int
	opts options

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Available reports whether redis-server can be found in PATH.
func Available() bool {
	_, err := exec.LookPath(Binary)
	return err == nil
}

// Require skips the test, or fails it when SPILLWAY_REQUIRE_REDIS=1, if
// redis-server is not installed.
func Require(t testing.TB) {
	t.Helper()
	if Available() {
		return
	}
	msg := Binary + " not found in PATH (install it with .ci/deps.sh or apt-get install redis-server)"
	if os.Getenv(EnvRequire) == "1" {
		t.Fatal(msg + "; " + EnvRequire + "=1 requires it")
	}
	t.Skip(msg)
}

// Start launches redis-server on a free loopback port in a fresh temporary
// directory and waits until it answers PING. The server is stopped when the
// test and its subtests finish.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	Require(t)
	s := &Server{t: t, dir: t.TempDir()}
	for _, o := range opts {
		o(&s.opts)
	}
	t.Cleanup(s.stop)
	// A free port can be taken by someone else between our probe and the
	// server's bind; try a few.
	var err error
	for range 5 {
		s.port, err = freePort()
		if err != nil {
			continue
		}
		if err = s.launch(); err == nil {
			return s
		}
		if !errors.Is(err, errExited) {
			break // it started but never answered: another port will not help
		}
	}
	t.Fatalf("redistest: starting %s: %v", Binary, err)
	return nil
}

// Addr returns the host:port the server listens on.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Dir returns the server's working directory (AOF, logs).
func (s *Server) Dir() string { return s.dir }

// Kill sends SIGKILL to the server and waits for it to exit: no shutdown,
// no final fsync. Killing a server that is not running is a no-op.
func (s *Server) Kill() {
	s.t.Helper()
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Restart starts the server again on the same port and directory, after a
// Kill (or kills it first). With WithAOF it replays its append-only file.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	// The old socket may linger briefly; the port is ours, so retry it.
	deadline := time.Now().Add(startTimeout)
	for {
		if err = s.launch(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: restarting %s on %s: %v", Binary, s.Addr(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Running reports whether the server process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

func (s *Server) stop() {
	s.Kill()
}

func (s *Server) args() []string {
	a := []string{
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--daemonize", "no",
		"--protected-mode", "no",
		"--save", "",
		"--dbfilename", "dump.rdb",
	}
	if s.opts.tls != nil {
		a = append(a, "--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", s.opts.tls.Cert, "--tls-key-file", s.opts.tls.Key,
			"--tls-ca-cert-file", s.opts.tls.CA,
			"--tls-auth-clients", map[bool]string{true: "yes", false: "no"}[s.opts.tls.ClientAuth])
	} else {
		a = append(a, "--port", strconv.Itoa(s.port))
	}
	if s.opts.aof {
		a = append(a, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		a = append(a, "--appendonly", "no")
	}
	if s.opts.password != "" {
		a = append(a, "--requirepass", s.opts.password)
	}
	return append(a, s.opts.args...)
}

func (s *Server) launch() error {
	cmd := exec.Command(Binary, s.args()...)
	cmd.Dir = s.dir
	var stderr bytes.Buffer
	cmd.Stdout = &stderr
	cmd.Stderr = &stderr
	// Its own process group, so a signal to the test's group does not hit it
	// twice and the server never outlives a killed test binary for long.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(done)
	}()
	if err := s.waitReady(done); err != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		return fmt.Errorf("%w (exit: %v; output: %s; log: %s)", err, waitErr,
			strings.TrimSpace(stderr.String()), s.logTail())
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// waitReady polls PING until the server answers (any reply: -NOAUTH means
// it is up too), the process exits, or startTimeout passes. With AOF the
// server answers -LOADING while it replays; that is not ready yet.
func (s *Server) waitReady(exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		select {
		case <-exited:
			return errExited
		case <-ctx.Done():
			return errors.New("redis-server did not answer PING in time")
		default:
		}
		if reply, err := s.ping(); err == nil && !strings.HasPrefix(reply, "-LOADING") {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) ping() (string, error) {
	var conn net.Conn
	var err error
	d := net.Dialer{Timeout: time.Second}
	if s.opts.tls != nil {
		cfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // a readiness probe of our own server
		if s.opts.tls.ClientAuth {
			cert, err := tls.LoadX509KeyPair(s.opts.tls.ClientCert, s.opts.tls.ClientKey)
			if err != nil {
				return "", err
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		conn, err = tls.DialWithDialer(&d, "tcp", s.Addr(), cfg)
	} else {
		conn, err = d.Dial("tcp", s.Addr())
	}
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(line), nil
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

var errExited = errors.New("redis-server exited during start")

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
