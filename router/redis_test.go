package router

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// waitHandled waits until n messages were handled.
func waitHandled(t *testing.T, handled *atomic.Int64, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for handled.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("handled %d of %d messages", handled.Load(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConsumerGroup: the backend names the group the broker
// really consumes in.
func TestConsumerGroup(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		r, err := New(Config{Broker: brokerMemory}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if g := r.back.group("h"); g != "" {
			t.Errorf("memory ConsumerGroup = %q, want none", g)
		}
	})
	t.Run("kafka", func(t *testing.T) {
		// Configuration only: the group the Kafka backend subscribes with.
		cfg := Config{Broker: brokerKafka}
		cfg.Kafka.ConsumerGroup = "ingest"
		cfg.setDefaults()
		r := &Router{cfg: cfg, back: &kafkaBackend{cfg: cfg.Kafka}}
		if g := r.back.group("h"); g != "ingest.h" {
			t.Errorf("kafka ConsumerGroup = %q, want ingest.h", g)
		}
	})
	t.Run("redis", func(t *testing.T) {
		defer goleak.VerifyNone(t, leakOptions...)
		cfg := redisConfig(t)
		cfg.Redis.ConsumerGroup = "tiler"
		r, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		var handled atomic.Int64
		if _, err := r.AddConsumerHandler("h", "shapes", func(*message.Message) error {
			handled.Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		errc := runRouter(t, r)
		defer closeRouter(t, r, errc)
		if err := r.Publisher().Publish("shapes", message.NewMessage("m-1", pingPayload(1))); err != nil {
			t.Fatal(err)
		}
		waitHandled(t, &handled, 1)

		if g := r.back.group("h"); g != "tiler.h" {
			t.Fatalf("redis ConsumerGroup = %q, want tiler.h", g)
		}
		client := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
		defer client.Close()
		groups, err := client.XInfoGroups(context.Background(), "shapes").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(groups) != 1 || groups[0].Name != r.back.group("h") {
			t.Errorf("groups on the stream = %+v, want only %q", groups, r.back.group("h"))
		}
	})
}

// TestWithRedisClient: with a client of the caller's the router needs no
// redis.addr, publishes and consumes through that client only, and leaves
// it open when it closes.
func TestWithRedisClient(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 16, ClientName: "users-pool"})
	defer client.Close()

	cfg := Config{Broker: brokerRedis}
	cfg.Redis.BlockTime = 50 * time.Millisecond
	var ce *spillway.FieldError
	if _, err := New(cfg, nil); !errors.As(err, &ce) || ce.Field != "redis.addr" {
		t.Fatalf("no addr, no client: err = %v, want a redis.addr error", err)
	}
	// Options without a client leave redis.addr required: redisbroker
	// rejects it, and New names the section's field.
	if _, err := New(cfg, nil, WithRedis(redisbroker.WithoutNackCount())); !errors.As(err, &ce) || ce.Field != "redis.addr" {
		t.Fatalf("no addr, options without a client: err = %v, want a redis.addr error", err)
	}
	bad := cfg
	bad.Redis.ConsumerGroup = " "
	if _, err := New(bad, nil, WithRedis(redisbroker.WithClient(client))); !errors.As(err, &ce) || ce.Field != "redis.consumer_group" {
		t.Fatalf("blank group with a client: err = %v, want a redis.consumer_group error", err)
	}

	r, err := New(cfg, nil, WithRedis(redisbroker.WithClient(client)))
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	if _, err := r.AddConsumerHandler("h", "shapes", func(*message.Message) error {
		handled.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	for i := range 3 {
		if err := r.Publisher().Publish("shapes", message.NewMessage("m-"+string(rune('a'+i)), pingPayload(i))); err != nil {
			t.Fatal(err)
		}
	}
	waitHandled(t, &handled, 3)
	ctx := context.Background()
	if lag, err := r.Lag(ctx); err != nil {
		t.Errorf("Lag through the caller's client: %v", err)
	} else if lag < 0 {
		t.Errorf("Lag = %d", lag)
	}
	list, err := client.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(list, "name=spillway-") || !strings.Contains(list, "name=users-pool") {
		t.Errorf("the router opened connections of its own:\n%s", list)
	}
	closeRouter(t, r, errc)
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("the router closed the caller's client: %v", err)
	}
	if n, err := client.XLen(ctx, "shapes").Result(); err != nil || n != 3 {
		t.Errorf("XLEN shapes = %d, %v; want 3", n, err)
	}
}

// Close returns only once the Redis subscribers have finished closing,
// their last acknowledgements sent: Watermill's router stops waiting for a
// subscriber as soon as its message channels close, and a Redis subscriber
// sends the acks still queued after that. A server paused for writes holds
// the last ack back while the router closes.
func TestCloseWaitsForRedisAcks(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	srv := redistest.Start(t)
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	cfg := Config{Broker: brokerRedis}
	cfg.Redis.Addr = srv.Addr()
	cfg.Redis.BlockTime = 50 * time.Millisecond
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	if _, err := r.AddConsumerHandler("h", "held", func(*message.Message) error {
		entered <- struct{}{}
		<-release
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	if err := r.Publisher().Publish("held", message.NewMessage("m", pingPayload(0))); err != nil {
		t.Fatal(err)
	}
	<-entered
	ctx := context.Background()
	if err := raw.Do(ctx, "CLIENT", "PAUSE", "1500", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	close(release) // acked by Watermill; the XACK waits for the pause
	closeRouter(t, r, errc)
	groups, err := raw.XInfoGroups(ctx, "held").Result()
	if err != nil || len(groups) != 1 {
		t.Fatalf("XINFO GROUPS held = %v, %v", groups, err)
	}
	if groups[0].Pending != 0 {
		t.Errorf("%d entries still pending after Close returned: the router did not wait for the subscriber's last ack", groups[0].Pending)
	}
}

// TestTopLevelConsumerGroup: consumer_group (SPILLWAY_CONSUMER_GROUP) is
// the group prefix on both brokers, so switching brokers keeps it; a
// broker's own consumer_group overrides it for that broker.
func TestTopLevelConsumerGroup(t *testing.T) {
	t.Run("load", func(t *testing.T) {
		clearEnv(t)
		p := writeConfig(t, "consumer_group: tiles\n")
		c, src, err := LoadConfigSources(p)
		if err != nil {
			t.Fatal(err)
		}
		if c.ConsumerGroup != "tiles" || c.Kafka.ConsumerGroup != "tiles" || c.Redis.ConsumerGroup != "tiles" {
			t.Errorf("groups %q kafka %q redis %q, want tiles for all", c.ConsumerGroup, c.Kafka.ConsumerGroup, c.Redis.ConsumerGroup)
		}
		for _, k := range []string{"consumer_group", "kafka.consumer_group", "redis.consumer_group"} {
			if src[k] != p+":1" {
				t.Errorf("source of %s = %q, want %s:1", k, src[k], p)
			}
		}

		t.Setenv("SPILLWAY_CONSUMER_GROUP", "geo")
		p = writeConfig(t, "consumer_group: tiles\nkafka:\n  consumer_group: ingest\n")
		c, src, err = LoadConfigSources(p)
		if err != nil {
			t.Fatal(err)
		}
		if c.Kafka.ConsumerGroup != "ingest" || c.Redis.ConsumerGroup != "geo" {
			t.Errorf("kafka %q redis %q, want ingest (its own) and geo (the environment's)", c.Kafka.ConsumerGroup, c.Redis.ConsumerGroup)
		}
		if src["kafka.consumer_group"] != p+":3" || src["redis.consumer_group"] != "env SPILLWAY_CONSUMER_GROUP" {
			t.Errorf("sources kafka %q redis %q", src["kafka.consumer_group"], src["redis.consumer_group"])
		}

		t.Setenv("SPILLWAY_CONSUMER_GROUP", "")
		_, err = LoadConfig(writeConfig(t, "consumer_group: ' '\n"))
		var fe *spillway.FieldError
		if !errors.As(err, &fe) || fe.Field != "consumer_group" {
			t.Errorf("blank consumer_group: %v", err)
		}
	})
	t.Run("kafka", func(t *testing.T) {
		cfg := Config{Broker: brokerKafka, ConsumerGroup: "tiles"}
		cfg.setDefaults()
		r := &Router{cfg: cfg, back: &kafkaBackend{cfg: cfg.Kafka}}
		if g := r.back.group("h"); g != "tiles.h" {
			t.Errorf("kafka ConsumerGroup = %q, want tiles.h", g)
		}
	})
	t.Run("redis", func(t *testing.T) {
		defer goleak.VerifyNone(t, leakOptions...)
		cfg := redisConfig(t)
		cfg.ConsumerGroup = "tiles"
		r, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		var handled atomic.Int64
		if _, err := r.AddConsumerHandler("h", "shapes", func(*message.Message) error {
			handled.Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		errc := runRouter(t, r)
		defer closeRouter(t, r, errc)
		if err := r.Publisher().Publish("shapes", message.NewMessage("m-1", pingPayload(1))); err != nil {
			t.Fatal(err)
		}
		waitHandled(t, &handled, 1)
		client := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
		defer client.Close()
		groups, err := client.XInfoGroups(context.Background(), "shapes").Result()
		if err != nil {
			t.Fatal(err)
		}
		if r.back.group("h") != "tiles.h" || len(groups) != 1 || groups[0].Name != "tiles.h" {
			t.Errorf("ConsumerGroup %q, groups on the stream %+v, want tiles.h", r.back.group("h"), groups)
		}
	})
}
