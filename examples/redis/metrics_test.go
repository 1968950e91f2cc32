package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	_ "github.com/spillway-go/spillway/embedded" // Addr "embedded"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/redisbroker"
)

// TestMetricsEndpoint: with -metrics-addr the demo exports its budget and
// the consumer group's lag at /metrics (embedded miniredis).
func TestMetricsEndpoint(t *testing.T) {
	ms, err := serveMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	cfg := redisbroker.Config{Addr: spillway.Embedded, ConsumerGroup: "metrics-test", Consumers: 1, BlockTime: 50 * time.Millisecond}
	pub, err := redisbroker.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, err := redisbroker.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	budget, err := middleware.NewVertexBudget(4321)
	if err != nil {
		t.Fatal(err)
	}
	in, err := instrument(ms.provider, budget, sub, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "metrics.test")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if err := pub.Publish("metrics.test", message.NewMessage(id, []byte("{}"))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case m := <-msgs:
		m.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("nothing delivered")
	}
	if err := in.sampler.Sample(ctx); err != nil {
		t.Fatal(err)
	}

	resp, err := http.Get(ms.url)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", ms.url, resp.StatusCode, err)
	}
	for _, want := range []string{
		`spillway_budget_capacity{budget="redis-demo"`,
		`spillway_consumer_lag{group="metrics-test"`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}
