package router

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
)

// TestRedisLanesOnOneStream: pings and heavy messages share one Redis
// stream and one handler, split into lanes by max_charge, with the heavy
// lane saturated (one heavy fits the budget at a time, and heavies arrive
// faster than they are handled). Every consumer soon holds a heavy message
// waiting for budget; pings must still reach the budget and run at once
// (p95 under 100 ms), every heavy must still be handled, and every message
// exactly once.
func TestRedisLanesOnOneStream(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := redisConfig(t)
	cfg.Telemetry.Disabled = true
	cfg.Budget.Vertices = 1000
	cfg.Budget.Lanes = []middleware.Lane{
		{Name: "pings", MaxCharge: 100, Reserve: 0.1},
		{Name: "heavy"},
	}
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}

	const (
		heavyWork = 150 * time.Millisecond
		burst     = 12 // heavies published at once, before the pings start
		pings     = 200
		pingEvery = 10 * time.Millisecond
		heavyMore = 20 // one heavy every heavyEvery pings, while they flow
	)
	heavyEvery := pings / heavyMore
	var (
		mu      sync.Mutex
		runs    = map[string]int{}
		pingLat []time.Duration
	)
	if _, err := r.AddConsumerHandler("shapes", "shapes", func(msg *message.Message) error {
		sent, _ := strconv.ParseInt(msg.Metadata.Get("sent_at"), 10, 64)
		heavy := msg.Metadata.Get("kind") == "heavy"
		mu.Lock()
		runs[msg.UUID]++
		if !heavy {
			pingLat = append(pingLat, time.Since(time.Unix(0, sent)))
		}
		mu.Unlock()
		if heavy {
			time.Sleep(heavyWork)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	defer closeRouter(t, r, errc)

	publish := func(uuid, kind string, vertices int) {
		t.Helper()
		msg := message.NewMessage(uuid, pingPayload(len(uuid)))
		msg.Metadata.Set(cost.MetadataKey, strconv.Itoa(vertices))
		msg.Metadata.Set("kind", kind)
		msg.Metadata.Set("sent_at", strconv.FormatInt(time.Now().UnixNano(), 10))
		if err := r.Publisher().Publish("shapes", msg); err != nil {
			t.Fatal(err)
		}
	}
	heavies := 0
	for range burst {
		publish(fmt.Sprintf("heavy-%d", heavies), "heavy", 900)
		heavies++
	}
	for i := range pings {
		if i%heavyEvery == 0 {
			publish(fmt.Sprintf("heavy-%d", heavies), "heavy", 900)
			heavies++
		}
		publish(fmt.Sprintf("ping-%d", i), "ping", 1)
		time.Sleep(pingEvery)
	}
	total := pings + heavies
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		if n == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("handled %d of %d messages", n, total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // room for a duplicate to show

	mu.Lock()
	defer mu.Unlock()
	for uuid, n := range runs {
		if n != 1 {
			t.Errorf("%s handled %d times, want once", uuid, n)
		}
	}
	slices.Sort(pingLat)
	p95 := pingLat[len(pingLat)*95/100]
	t.Logf("%d pings: p50 %v, p95 %v, max %v; %d heavies of %v each", len(pingLat),
		pingLat[len(pingLat)/2], p95, pingLat[len(pingLat)-1], heavies, heavyWork)
	if p95 >= 100*time.Millisecond {
		t.Errorf("ping p95 = %v, want under 100ms: pings waited behind heavy messages", p95)
	}
}

// redis.window defaults to 1, and to 16 when a budget lane selects by
// max_charge (light and heavy messages then share a stream); a value set
// is kept, and one out of range is rejected naming redis.window.
func TestRedisWindowDefault(t *testing.T) {
	clearEnv(t)
	byCharge := []middleware.Lane{{Name: "pings", MaxCharge: 100}, {Name: "rest"}}
	byHandler := []middleware.Lane{{Name: "fast", Handlers: []string{"h"}}, {Name: "rest"}}
	for _, tt := range []struct {
		name  string
		lanes []middleware.Lane
		set   int
		want  int
	}{
		{"no lanes", nil, 0, 1},
		{"lanes by handler", byHandler, 0, 1},
		{"lanes by charge", byCharge, 0, 16},
		{"set", byCharge, 4, 4},
	} {
		c := Config{Broker: brokerRedis}
		c.Budget.Lanes = tt.lanes
		c.Redis.Window = tt.set
		c.setDefaults()
		if c.Redis.Window != tt.want {
			t.Errorf("%s: redis.window = %d, want %d", tt.name, c.Redis.Window, tt.want)
		}
	}

	c, err := LoadConfig(writeConfig(t, "broker: redis\nredis:\n  addr: localhost:6379\n  window: 8\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Redis.Window != 8 {
		t.Errorf("redis.window from YAML = %d, want 8", c.Redis.Window)
	}
	c.Redis.Window = 2000
	var fe *spillway.FieldError
	if err := c.Validate(); !errors.As(err, &fe) || fe.Field != "redis.window" || fe.Value != "2000" {
		t.Errorf("Validate with redis.window 2000 = %v, want an error on redis.window", err)
	}
}
