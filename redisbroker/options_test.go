package redisbroker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// With WithClient the publisher and the subscriber send everything through
// the caller's client (no Addr needed), deliver as usual, and leave the
// client open when they close.
func TestWithClient(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 8, ClientName: "users-pool"})
	defer client.Close()
	cfg := testConfig(srv)
	cfg.Addr = "" // the client's address is the one used
	topic := uniq("own-client")

	pub, err := redisbroker.NewPublisher(cfg, redisbroker.WithClient(client))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := redisbroker.NewSubscriber(cfg, redisbroker.WithLogger(testLogger(t)), redisbroker.WithClient(client))
	if err != nil {
		t.Fatal(err)
	}
	publish(t, pub, topic, ids("m", 5)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < 5 {
		select {
		case m := <-ch:
			seen[m.UUID] = true
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("got %d of 5 messages", len(seen))
		}
	}
	// Every connection the broker opened came from the caller's pool.
	list, err := client.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n := countName(list, "name=users-pool"); n == 0 || countName(list, "name=spillway-") != 0 {
		t.Errorf("CLIENT LIST has %d users-pool connections and some of spillway's own:\n%s", n, list)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("the caller's client was closed: %v", err)
	}
	if err := pub.Publish(topic); !errors.Is(err, spillway.ErrClosed) {
		t.Fatalf("Publish after Close: %v", err)
	}
}

// countName counts the CLIENT LIST lines with a field starting with prefix.
func countName(list, prefix string) int {
	n := 0
	for line := range strings.Lines(list) {
		for f := range strings.FieldsSeq(line) {
			if strings.HasPrefix(f, prefix) {
				n++
			}
		}
	}
	return n
}

func TestWithClientNil(t *testing.T) {
	cfg := redisbroker.Config{ConsumerGroup: "g"}
	if _, err := redisbroker.NewPublisher(cfg, redisbroker.WithClient(nil)); !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Errorf("publisher: err = %v", err)
	}
	if _, err := redisbroker.NewSubscriber(cfg, redisbroker.WithClient(nil)); !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Errorf("subscriber: err = %v", err)
	}
	// Without a client, Addr is still required.
	if _, err := redisbroker.NewSubscriber(cfg); !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Errorf("no Addr, no client: err = %v", err)
	}
	// The stream and subscriber fields are still checked with a client.
	bad := cfg
	bad.DefaultMaxLen = -1
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := redisbroker.NewSubscriber(bad, redisbroker.WithClient(c)); !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Errorf("DefaultMaxLen -1 with a client: err = %v", err)
	}
}
