package router

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"
)

// A payload that hangs its consumer is dead-lettered after
// redis.max_deliveries runs, and the good messages its consumers had read
// ahead behind it are not dead-lettered with it: they never ran there, so
// those deliveries do not count (issue 34, item 2). Four consumers: the
// poison hangs three of them, one after the other, each presumed stuck
// after keep_alive.max_in_flight; the fourth finds it past max_deliveries.
// Each run checks that good messages were actually held behind the poison
// (Stats of the keep-alive: more entries expired than the poison's three
// expiries), so a pass means something; with the retry gate on and off.
func TestRedisPoisonNeighboursNotDeadLettered(t *testing.T) {
	for _, gate := range []string{"gate-on", "gate-off"} {
		t.Run(gate, func(t *testing.T) {
			held := 0
			const runs = 4
			for i := range runs {
				held += redisPoisonRun(t, gate == "gate-on", i)
				if t.Failed() {
					return
				}
			}
			t.Logf("good entries held behind the poison in %d runs: %d", runs, held)
			if held == 0 {
				t.Error("no good entry was ever held behind the poison: the runs proved nothing")
			}
		})
	}
}

// redisPoisonRun runs one poison and 12 good messages through a router on
// a fresh redis-server and returns how many good entries were expired with
// the poison (held by a consumer it hung).
func redisPoisonRun(t *testing.T, gate bool, run int) int {
	defer goleak.VerifyNone(t, leakOptions...)
	const goods = 12
	cfg, rc := edgeRedis(t, func(c *Config) {
		c.Retry.Disabled = !gate
		c.Redis.Consumers = 4
		c.Redis.MaxDeliveries = 3
		c.Redis.MaxIdleTime = 600 * time.Millisecond // keep-alive every 200 ms
		c.Redis.KeepAlive.MaxInFlight = 400 * time.Millisecond
		c.Redis.DeadLetterTopic = "jobs.dead"
	})
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var (
		mu      sync.Mutex
		runs    = map[string]int{}
		started = make(chan struct{}, 8)
	)
	if _, err := r.AddConsumerHandler("h", "jobs", func(msg *message.Message) error {
		mu.Lock()
		runs[msg.UUID]++
		mu.Unlock()
		if msg.UUID != "poison" {
			return nil
		}
		started <- struct{}{}
		select { // hangs its consumer until the router closes
		case <-msg.Context().Done():
		case <-release:
		}
		return msg.Context().Err()
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	publishCosted(t, r, "jobs", "poison", 10)
	<-started
	// The hung consumer reads ahead of its handler: some of these wait
	// behind the poison.
	for i := range goods {
		publishCosted(t, r, "jobs", fmt.Sprintf("good-%d", i), 10)
	}
	ctx := context.Background()
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range goods {
			if runs[fmt.Sprintf("good-%d", i)] == 0 {
				return false
			}
		}
		n, _ := rc.XLen(ctx, "jobs.dead").Result()
		return n >= 1
	}
	deadline := time.Now().Add(15 * time.Second)
	for !done() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ka, _ := r.back.keepAlive()
	close(release)
	closeRouter(t, r, errc)

	dl, err := rc.XRange(ctx, "jobs.dead", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var dead []string
	for _, e := range dl {
		msg, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(e.Values)
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, msg.UUID+" ("+msg.Metadata.Get("spillway_deadletter_reason")+")")
	}
	mu.Lock()
	defer mu.Unlock()
	var missing []string
	for i := range goods {
		if id := fmt.Sprintf("good-%d", i); runs[id] == 0 {
			missing = append(missing, id)
		}
	}
	if len(dead) != 1 || !strings.HasPrefix(dead[0], "poison (delivered 4 times") {
		t.Errorf("run %d: dead-lettered %q, want the poison alone, delivered 4 times", run, dead)
	}
	if len(missing) > 0 {
		t.Errorf("run %d: good messages never handled: %v", run, missing)
	}
	if runs["poison"] != 3 {
		t.Errorf("run %d: poison ran %d times, want 3 (redis.max_deliveries)", run, runs["poison"])
	}
	// The poison expired once on each of the three consumers it hung;
	// anything more was a good entry held behind it.
	return max(0, int(ka.Expired)-3)
}
