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
	"github.com/spillway-go/spillway/router"
	"github.com/spillway-go/spillway/telemetry"
)

// TestMetricsEndpoint: with -metrics-addr the demo's router exports its
// budget and consumer lag at /metrics.
func TestMetricsEndpoint(t *testing.T) {
	ms, err := serveMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()

	cfg := router.Config{Broker: "kafka"}
	cfg.Kafka.Brokers = []string{spillway.Embedded}
	cfg.Kafka.Partitions = 1
	cfg.Budget.Vertices = 4321
	cfg.Telemetry.LagInterval = 100 * time.Millisecond
	r, err := router.New(cfg, nil, router.WithTelemetry(telemetry.WithMeterProvider(ms.provider)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	done := make(chan struct{}, 1)
	if _, err := r.AddConsumerHandler("reference", topic, func(*message.Message) error {
		done <- struct{}{}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	if err := r.Publisher().Publish(topic, message.NewMessage("p-1", []byte(`{"type":"Point","coordinates":[1,2]}`))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("message not consumed")
	}
	wants := []string{
		`spillway_budget_capacity{budget="spillway"`,
		`spillway_consumer_lag{group="spillway.reference",otel_scope_name=`,
		`spillway_process_duration_seconds_count{`,
	}
	// The lag sampler, started by Run, samples every telemetry.lag_interval
	// (100 ms here), and the processing duration is recorded once the
	// handler has returned, after it signalled done: scrape until every
	// series shows up.
	var body []byte
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get(ms.url)
		if err != nil {
			t.Fatal(err)
		}
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v", ms.url, resp.StatusCode, err)
		}
		all := true
		for _, want := range wants {
			all = all && strings.Contains(string(body), want)
		}
		if all || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range wants {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	if !strings.Contains(string(body), "4321") {
		t.Error("/metrics does not show the budget's capacity 4321")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
}
