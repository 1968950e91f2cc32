package router

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/producer"
)

// With producer.rate_limit set, Publisher publishes no faster than the
// rate: over ten seconds of fake time, the burst plus rate × elapsed, to
// within one message. Handler output is not limited.
func TestProducerRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate, burst, size = 1000.0, 500, 100
		cfg := Config{Telemetry: TelemetryConfig{Disabled: true}}
		cfg.Producer.RateLimit = ProducerRateLimitConfig{VerticesPerSecond: rate, Burst: burst}
		r, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if r.rateLimited == nil || r.lagThrottled != nil {
			t.Fatalf("rate limit %v, lag throttle %v; want only the rate limit", r.rateLimited, r.lagThrottled)
		}
		if st := r.Stats(); st.RateLimit == nil || st.LagThrottle != nil {
			t.Fatalf("Stats: rate limit %v, lag throttle %v; want only the rate limit", st.RateLimit, st.LagThrottle)
		}
		if c := r.cfg.Producer.RateLimit; c.Mode != producer.Block || c.Burst != burst {
			t.Fatalf("mode %s, burst %d", c.Mode, c.Burst)
		}

		start := time.Now()
		var total int64
		for i := 0; time.Since(start) < 10*time.Second; i++ {
			msg := message.NewMessage(strconv.Itoa(i), pingPayload(i))
			msg.Metadata.Set(cost.MetadataKey, strconv.Itoa(size))
			if err := r.Publisher().Publish("shapes", msg); err != nil {
				t.Fatal(err)
			}
			total += size
		}
		elapsed := time.Since(start)
		if limit := burst + rate*elapsed.Seconds(); float64(total) > limit || float64(total) < limit-size {
			t.Fatalf("published %d vertices in %v, want at most %.0f and within %d of it", total, elapsed, limit, size)
		}
		if s := *r.Stats().RateLimit; s.Throttled == 0 || s.Waited <= 0 {
			t.Fatalf("stats = %+v, want throttled calls and some wait", s)
		}
	})
}

// Unstamped messages are stamped before the limit charges them, and in
// reject mode a publish over the rate fails with ErrRateLimited.
func TestProducerRateLimitRejectStamps(t *testing.T) {
	cfg := Config{Telemetry: TelemetryConfig{Disabled: true}}
	cfg.Producer.RateLimit = ProducerRateLimitConfig{VerticesPerSecond: 0.001, Burst: 5, Mode: producer.Reject}
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	line := []byte(`{"type":"LineString","coordinates":[[0,0],[1,1],[2,2]]}`) // 3 vertices
	if err := r.Publisher().Publish("shapes", message.NewMessage("a", line)); err != nil {
		t.Fatal(err)
	}
	// Charged the stamped 3 of the bucket's 5, not the default (the
	// burst): a 2-vertex line still fits.
	short := []byte(`{"type":"LineString","coordinates":[[0,0],[1,1]]}`)
	if err := r.Publisher().Publish("shapes", message.NewMessage("s", short)); err != nil {
		t.Fatalf("a 2-vertex line after 3 of 5 vertices: %v (was the first not charged its stamped count?)", err)
	}
	if err := r.Publisher().Publish("shapes", message.NewMessage("b", line)); !errors.Is(err, producer.ErrRateLimited) {
		t.Fatalf("err = %v, want ErrRateLimited", err)
	}
}

// Without a producer section nothing is wrapped.
func TestProducerOff(t *testing.T) {
	r, err := New(Config{Telemetry: TelemetryConfig{Disabled: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.rateLimited != nil || r.lagThrottled != nil {
		t.Fatal("producer layers built without a producer section")
	}
	if st := r.Stats(); st.RateLimit != nil || st.LagThrottle != nil {
		t.Fatalf("Stats: rate limit %v, lag throttle %v without a producer section", st.RateLimit, st.LagThrottle)
	}
	c := r.cfg.Producer
	if c.RateLimit.Mode != producer.Block || c.LagThrottle.Step != 100*time.Millisecond || c.LagThrottle.Max != 5*time.Second {
		t.Fatalf("defaults = %+v", c)
	}
}

// Invalid producer values are validation errors naming the field, from
// Validate and from New.
func TestProducerValidation(t *testing.T) {
	for _, c := range []struct {
		name  string
		set   func(*Config)
		field string
	}{
		{"negative rate", func(c *Config) { c.Producer.RateLimit.VerticesPerSecond = -1 }, "producer.rate_limit.vertices_per_second"},
		{"negative burst", func(c *Config) { c.Producer.RateLimit.Burst = -5 }, "producer.rate_limit.burst"},
		{"unknown mode", func(c *Config) { c.Producer.RateLimit.Mode = "drop" }, "producer.rate_limit.mode"},
		{"negative threshold", func(c *Config) { c.Producer.LagThrottle.Threshold = -1 }, "producer.lag_throttle.threshold"},
		{"negative step", func(c *Config) { c.Producer.LagThrottle.Step = -time.Second }, "producer.lag_throttle.step"},
		{"negative max", func(c *Config) { c.Producer.LagThrottle.Max = -time.Second }, "producer.lag_throttle.max"},
		{"throttle on memory", func(c *Config) { c.Producer.LagThrottle.Threshold = 100 }, "producer.lag_throttle.threshold"},
		{"throttle without telemetry", func(c *Config) {
			c.Broker = brokerKafka
			c.Kafka.Brokers = []string{"127.0.0.1:1"}
			c.Telemetry.Disabled = true
			c.Producer.LagThrottle.Threshold = 100
		}, "producer.lag_throttle.threshold"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var cfg Config
			c.set(&cfg)
			for what, err := range map[string]error{"Validate": cfg.Validate(), "New": func() error { _, err := New(cfg, nil); return err }()} {
				var ce *spillway.FieldError
				if !errors.As(err, &ce) || ce.Field != c.field {
					t.Errorf("%s: %v, want a FieldError on %s", what, err, c.field)
				}
			}
		})
	}
	ok := Config{Broker: brokerKafka}
	ok.Kafka.Brokers = []string{"127.0.0.1:1"}
	ok.Producer.LagThrottle.Threshold = 100
	ok.Producer.RateLimit.VerticesPerSecond = 10
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid producer section: %v", err)
	}
}

// The section loads from YAML and from SPILLWAY_PRODUCER_* variables.
func TestProducerLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	yml := "producer:\n  rate_limit:\n    vertices_per_second: 50000\n    mode: reject\n  lag_throttle:\n    step: 250ms\n"
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SPILLWAY_PRODUCER_RATE_LIMIT_BURST", "200000")
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Producer
	if p.RateLimit.VerticesPerSecond != 50_000 || p.RateLimit.Burst != 200_000 || p.RateLimit.Mode != producer.Reject || p.LagThrottle.Step != 250*time.Millisecond {
		t.Fatalf("loaded %+v", p)
	}
	if err := os.WriteFile(path, []byte("producer:\n  rate_limit:\n    burst: lots\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var ce *spillway.FieldError
	if _, err := LoadConfig(path); !errors.As(err, &ce) || ce.Field != "producer.rate_limit.burst" {
		t.Fatalf("bad burst: %v", err)
	}
}

// On redis, producer.lag_throttle reads the router's lag sampler: while
// the handler's consumer group lags by more than the threshold, Publisher
// waits.
func TestProducerLagThrottle(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...) // the subscribers have closed before the server stops
	cfg := redisConfig(t)
	cfg.Redis.Consumers = 1
	cfg.Telemetry.LagInterval = 50 * time.Millisecond
	cfg.Producer.LagThrottle.Threshold = 2
	cfg.Producer.LagThrottle.Step = 10 * time.Millisecond
	cfg.Producer.LagThrottle.Max = 100 * time.Millisecond
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.lagThrottled == nil || r.rateLimited != nil {
		t.Fatalf("rate limit %v, lag throttle %v; want only the lag throttle", r.rateLimited, r.lagThrottled)
	}
	if st := r.Stats(); st.LagThrottle == nil || st.RateLimit != nil {
		t.Fatalf("Stats: rate limit %v, lag throttle %v; want only the lag throttle", st.RateLimit, st.LagThrottle)
	}
	release := make(chan struct{})
	if _, err := r.AddConsumerHandler("h", "jobs", func(*message.Message) error { <-release; return nil }); err != nil {
		t.Fatal(err)
	}
	errc := runRouter(t, r)
	defer closeRouter(t, r, errc)
	defer close(release)

	for i := range 10 {
		if err := r.Publisher().Publish("jobs", message.NewMessage("j-"+strconv.Itoa(i), pingPayload(i))); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.lagSampler.TotalLag() <= cfg.Producer.LagThrottle.Threshold {
		if time.Now().After(deadline) {
			t.Fatalf("no throttle after 10s: lag %d", r.lagSampler.TotalLag())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.Publisher().Publish("jobs", message.NewMessage("late", pingPayload(1))); err != nil {
		t.Fatal(err)
	}
	if s := *r.Stats().LagThrottle; s.Throttled == 0 || s.Waited <= 0 {
		t.Fatalf("stats = %+v, want a throttled publish (lag %d)", s, r.lagSampler.TotalLag())
	}
}
