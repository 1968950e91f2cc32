package router

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/redisbroker"
)

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// New fails at once when redis.addr does not answer, naming the field and
// the address, with the cause (issue 32: before, New succeeded and Run
// failed seconds later, then waited out close_timeout).
func TestNewFailsFastWhenRedisIsUnreachable(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	addr := closedAddr(t)
	cfg := Config{Broker: brokerRedis}
	cfg.Redis.Addr = addr
	start := time.Now()
	r, err := New(cfg, nil)
	took := time.Since(start)
	if err == nil {
		_ = r.Close()
		t.Fatal("New succeeded with nothing listening on redis.addr")
	}
	if took > 2*time.Second {
		t.Errorf("New took %s to fail, want under 2 s", took)
	}
	msg := err.Error()
	if want := `router: redis.addr "` + addr + `": cannot reach Redis: `; !strings.HasPrefix(msg, want) {
		t.Errorf("error %q, want it to start with %q", msg, want)
	}
	if !errors.Is(err, redisbroker.ErrUnreachable) {
		t.Errorf("error %v does not match redisbroker.ErrUnreachable", err)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v does not match the cause, syscall.ECONNREFUSED", err)
	}
}

// With a client of the caller's, New pings Redis through it too, and
// leaves it open whether the ping fails or not.
func TestNewPingsTheGivenRedisClient(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	client := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1})
	defer client.Close()
	r, err := New(Config{Broker: brokerRedis}, nil, WithRedis(redisbroker.WithClient(client)))
	if err == nil {
		_ = r.Close()
		t.Fatal("New succeeded with a client that reaches nothing")
	}
	if !errors.Is(err, redisbroker.ErrUnreachable) || !strings.Contains(err.Error(), "WithRedis") {
		t.Errorf("error %v, want ErrUnreachable naming WithRedis", err)
	}
	// Still open: a closed client would say redis.ErrClosed.
	if err := client.Ping(t.Context()).Err(); errors.Is(err, redis.ErrClosed) {
		t.Errorf("New closed the caller's client: %v", err)
	}
}
