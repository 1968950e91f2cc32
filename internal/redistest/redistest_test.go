package redistest_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
)

func client(t *testing.T, opts *redis.Options) *redis.Client {
	t.Helper()
	opts.MaxRetries = -1
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestStartAnswersPing(t *testing.T) {
	s := redistest.Start(t)
	c := client(t, &redis.Options{Addr: s.Addr()})
	if err := c.Ping(ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	if !s.Running() {
		t.Fatal("Running() = false")
	}
}

// With AOF (fsync always) a write acknowledged before SIGKILL is there after
// the restart; the port stays the same.
func TestKillRestartKeepsAcknowledgedWrites(t *testing.T) {
	s := redistest.Start(t, redistest.WithAOF())
	addr := s.Addr()
	c := client(t, &redis.Options{Addr: addr})
	if err := c.XAdd(ctx(t), &redis.XAddArgs{Stream: "s", Values: []string{"k", "v"}}).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if s.Running() {
		t.Fatal("still running after Kill")
	}
	if err := c.Ping(ctx(t)).Err(); err == nil {
		t.Fatal("PING answered while killed")
	}
	s.Restart()
	if s.Addr() != addr {
		t.Fatalf("addr changed: %s -> %s", addr, s.Addr())
	}
	n, err := c.XLen(ctx(t), "s").Result()
	if err != nil || n != 1 {
		t.Fatalf("XLEN after restart = %d, %v; want 1", n, err)
	}
}

// Without AOF nothing survives a kill: the tests that rely on durability
// must ask for it.
func TestRestartWithoutAOFStartsEmpty(t *testing.T) {
	s := redistest.Start(t)
	c := client(t, &redis.Options{Addr: s.Addr()})
	if err := c.Set(ctx(t), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	if n, err := c.Exists(ctx(t), "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS after restart = %d, %v; want 0", n, err)
	}
}

func TestPassword(t *testing.T) {
	s := redistest.Start(t, redistest.WithPassword("s3cret"))
	if err := client(t, &redis.Options{Addr: s.Addr()}).Ping(ctx(t)).Err(); err == nil {
		t.Fatal("PING without AUTH succeeded")
	}
	if err := client(t, &redis.Options{Addr: s.Addr(), Password: "s3cret"}).Ping(ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestTLSWithClientCertificate(t *testing.T) {
	files := redistest.GenerateTLS(t)
	files.ClientAuth = true
	s := redistest.Start(t, redistest.WithTLS(files))
	pem, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	cert, err := tls.LoadX509KeyPair(files.ClientCert, files.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	c := client(t, &redis.Options{Addr: s.Addr(), TLSConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}})
	if err := c.Ping(ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	noCert := client(t, &redis.Options{Addr: s.Addr(), TLSConfig: &tls.Config{RootCAs: pool}})
	if err := noCert.Ping(ctx(t)).Err(); err == nil {
		t.Fatal("PING without a client certificate succeeded")
	}
}

// Without redis-server a test is skipped, or fails when
// SPILLWAY_REQUIRE_REDIS=1. Checked in a child process whose PATH is empty.
func TestMissingServerSkipsOrFails(t *testing.T) {
	if os.Getenv("REDISTEST_CHILD") == "1" {
		redistest.Start(t)
		t.Log("started") // not reached without redis-server
		return
	}
	run := func(require string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestMissingServerSkipsOrFails$", "-test.v")
		cmd.Env = []string{"PATH=", "REDISTEST_CHILD=1", redistest.EnvRequire + "=" + require}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("")
	if err != nil || !strings.Contains(out, "--- SKIP") || !strings.Contains(out, "redis-server not found") {
		t.Fatalf("without %s: err %v, output:\n%s", redistest.EnvRequire, err, out)
	}
	out, err = run("1")
	if err == nil || !strings.Contains(out, "--- FAIL") {
		t.Fatalf("with %s=1: err %v, output:\n%s", redistest.EnvRequire, err, out)
	}
}
