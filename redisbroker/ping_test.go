package redisbroker_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// Ping answers nil for a live server, directly or through a client of the
// caller's (left open), and fails at once, matching ErrUnreachable and the
// cause, for an address nothing listens on.
func TestPing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := redisbroker.Ping(ctx, redisbroker.Config{Addr: srv.Addr()}); err != nil {
		t.Errorf("Ping of a live server: %v", err)
	}
	client := rawClient(t, srv)
	if err := redisbroker.Ping(ctx, redisbroker.Config{}, redisbroker.WithClient(client)); err != nil {
		t.Errorf("Ping through a given client: %v", err)
	}
	if err := client.Ping(ctx).Err(); err != nil {
		t.Errorf("the given client after Ping: %v", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	start := time.Now()
	err = redisbroker.Ping(ctx, redisbroker.Config{Addr: closed})
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Ping of a closed port took %s, want under 2 s", took)
	}
	if !errors.Is(err, redisbroker.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Ping of a closed port: %v, want ErrUnreachable and ECONNREFUSED", err)
	}
}
