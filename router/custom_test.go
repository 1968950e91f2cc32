package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/telemetry"
)

// closeCounter counts Close calls on what it wraps.
type closeCounter struct{ n atomic.Int32 }

type countedPublisher struct {
	message.Publisher
	c *closeCounter
}

func (p countedPublisher) Close() error { p.c.n.Add(1); return p.Publisher.Close() }

type countedSubscriber struct {
	message.Subscriber
	c *closeCounter
}

func (s countedSubscriber) Close() error { s.c.n.Add(1); return s.Subscriber.Close() }

// gochannelBroker is Watermill's GoChannel wrapped as a custom broker, as
// a user would plug in NATS or AMQP: it records the subscribers the
// router asked for and what was closed, and when.
type gochannelBroker struct {
	ch      *gochannel.GoChannel
	pub     closeCounter
	mu      sync.Mutex
	asked   []string // handler=topic
	subs    []*closeCounter
	closes  atomic.Int32
	atClose string // what was already closed when Close was called
}

func newGochannelBroker() *gochannelBroker {
	return &gochannelBroker{ch: gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})}
}

func (g *gochannelBroker) custom(deadline time.Duration) CustomBroker {
	return CustomBroker{
		Publisher: countedPublisher{g.ch, &g.pub},
		Subscriber: func(handler, topic string) (message.Subscriber, error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			c := &closeCounter{}
			g.asked = append(g.asked, handler+"="+topic)
			g.subs = append(g.subs, c)
			return countedSubscriber{g.ch, c}, nil
		},
		RedeliveryDeadline: deadline,
		Close: func() error {
			g.mu.Lock()
			defer g.mu.Unlock()
			open := 0
			for _, s := range g.subs {
				if s.n.Load() == 0 {
					open++
				}
			}
			g.atClose = fmt.Sprintf("publisher closed %d times, %d subscribers open", g.pub.n.Load(), open)
			g.closes.Add(1)
			return nil
		},
	}
}

// TestCustomBroker runs the whole stack over GoChannel wrapped as a
// custom broker: stamping publisher, shedding, retry gate, budget and
// auto-sizer, a handler that publishes feeding a consumer handler; the
// redelivery deadline is the custom one, the sizer sizes against it, and
// Close closes the publisher, every subscriber, then the broker.
func TestCustomBroker(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	const deadline = 20 * time.Second
	g := newGochannelBroker()

	cfg := Config{CloseTimeout: 10 * time.Second} // broker unset: WithBroker selects custom
	cfg.Budget.Vertices = 4000
	cfg.Shedding.Topics = []string{"shapes.in"}
	cfg.Retry.InitialInterval, cfg.Retry.MaxInterval = time.Millisecond, 10*time.Millisecond
	a := &cfg.Budget.AutoSize
	a.Enabled = true
	a.Window, a.Windows, a.MinWindows = 30*time.Millisecond, 1, 1
	a.Ceiling, a.Hysteresis, a.TailShare = 1_000_000, spillway.Off, spillway.Off

	r, err := New(cfg, nil, WithBroker(g.custom(deadline)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if b := r.cfg.Broker; b != brokerCustom {
		t.Errorf("Broker = %q, want custom (selected by WithBroker)", b)
	}
	if d := r.cfg.RedeliveryDeadline(); d != deadline {
		t.Errorf("RedeliveryDeadline = %s, want the custom broker's %s", d, deadline)
	}
	if d := r.cfg.autoSizeDeadline(); d != deadline {
		t.Errorf("auto-sizer deadline = %s, want %s", d, deadline)
	}
	st := r.stack()
	if st.shedding == nil || st.retryGate == nil || st.tracing == nil || st.metrics == nil || r.sizer == nil {
		t.Errorf("stack incomplete over a custom broker: %+v, sizer %v", st, r.sizer)
	}

	var failed atomic.Bool
	if _, err := r.AddHandler("hull", "shapes.in", "shapes.out", func(msg *message.Message) ([]*message.Message, error) {
		if msg.UUID == "county-7" && failed.CompareAndSwap(false, true) {
			return nil, errors.New("transient") // the retry gate takes it
		}
		geo, err := cost.Decode(msg.Payload)
		if err != nil {
			return nil, err
		}
		work(geo, 1, nil)
		time.Sleep(2 * time.Millisecond)
		return []*message.Message{message.NewMessage(msg.UUID+"-hull", geojsonPayload(t, xyHull(geo)))}, nil
	}); err != nil {
		t.Fatal(err)
	}
	got := make(chan *message.Message, 100)
	if _, err := r.AddConsumerHandler("sink", "shapes.out", func(msg *message.Message) error {
		got <- msg
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.Background()) }()
	<-r.Running()

	const n = 30
	for i := range n {
		msg := message.NewMessage(fmt.Sprintf("county-%d", i), geojsonPayload(t, heavyGeometry(t, i*11, 300)))
		if err := r.Publisher().Publish("shapes.in", msg); err != nil {
			t.Fatal(err)
		}
		if msg.Metadata.Get(cost.MetadataKey) == "" {
			t.Fatalf("publisher did not stamp %s", msg.UUID)
		}
		time.Sleep(5 * time.Millisecond) // spread the traffic over several sizer windows
	}
	seen := map[string]bool{}
	for len(seen) < n {
		select {
		case m := <-got:
			if _, src := cost.ParseCount(m.Metadata.Get(cost.MetadataKey), len(m.Payload)); src != cost.SourceHeader {
				t.Errorf("%s reached the sink unstamped", m.UUID)
			}
			seen[m.UUID] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d messages reached the sink", len(seen), n)
		}
	}
	if !seen["county-7-hull"] || !failed.Load() {
		t.Error("the failed message did not come back through the retry gate")
	}
	if s := r.Stats(); s.Budget.Admitted < 2*n || s.Budget.PeakInUse == 0 || s.Retry == nil || s.Retry.Retries == 0 {
		t.Errorf("stats = %+v, retry %+v: the budget or the retry gate did not see the traffic", s.Budget, s.Retry)
	}
	if b := r.sizer.Bounds(); b.VerticesPerSecond == 0 {
		t.Error("the auto-sizer measured no window")
	} else if want := int64(b.VerticesPerSecond * deadline.Seconds() * 0.5); b.DeadlineBound != want {
		t.Errorf("deadline bound %d at %.0f vertices/s, want %d: sized against the custom deadline %s", b.DeadlineBound, b.VerticesPerSecond, want, deadline)
	}
	if _, err := r.Lag(context.Background()); !errors.Is(err, ErrLagUnknown) {
		t.Errorf("Lag = %v, want ErrLagUnknown without CustomBroker.Lag", err)
	}

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	want := []string{"hull=shapes.in", "hull.retry=shapes.in.retry", "sink=shapes.out", "sink.retry=shapes.out.retry"}
	if !slices.Equal(g.asked, want) {
		t.Errorf("subscribers asked for %v, want %v", g.asked, want)
	}
	if g.closes.Load() != 1 {
		t.Errorf("CustomBroker.Close called %d times, want 1", g.closes.Load())
	}
	if g.atClose != "publisher closed 1 times, 0 subscribers open" {
		t.Errorf("when CustomBroker.Close ran: %s; want the publisher and every subscriber closed first", g.atClose)
	}
	if err := r.Close(); err != nil || g.closes.Load() != 1 {
		t.Errorf("second Close: %v, broker closed %d times", err, g.closes.Load())
	}
}

// TestCustomBrokerSelection: broker custom and WithBroker go together, and
// the settings that depend on the broker are checked against the custom
// one.
func TestCustomBrokerSelection(t *testing.T) {
	fields := func(err error) []string {
		var out []string
		list := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			list = j.Unwrap()
		}
		for _, e := range list {
			var ce *spillway.FieldError
			if errors.As(e, &ce) {
				out = append(out, ce.Field+": "+ce.Reason)
			}
		}
		return out
	}
	newWith := func(t *testing.T, cfg Config, opts ...Option) error {
		t.Helper()
		r, err := New(cfg, nil, opts...)
		if err == nil {
			_ = r.Close()
		}
		return err
	}
	has := func(t *testing.T, err error, field, reason string) {
		t.Helper()
		for _, f := range fields(err) {
			if strings.HasPrefix(f, field+": ") && strings.Contains(f, reason) {
				return
			}
		}
		t.Errorf("error %v lacks %s (%q)", err, field, reason)
	}

	t.Run("custom without WithBroker", func(t *testing.T) {
		cfg := Config{Broker: brokerCustom}
		cfg.Budget.AutoSize.Enabled, cfg.Budget.AutoSize.Ceiling = true, 1000
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate of broker custom (deadline unknown until New): %v", err)
		}
		has(t, newWith(t, cfg), "broker", "needs router.WithBroker")
	})
	t.Run("WithBroker with another broker", func(t *testing.T) {
		g := newGochannelBroker()
		defer g.ch.Close()
		has(t, newWith(t, Config{Broker: brokerMemory}, WithBroker(g.custom(time.Second))), "broker", "must be custom, or left unset")
	})
	t.Run("incomplete broker", func(t *testing.T) {
		err := newWith(t, Config{}, WithBroker(CustomBroker{RedeliveryDeadline: -time.Second}))
		has(t, err, "broker", "Publisher is required")
		has(t, err, "broker", "Subscriber is required")
		has(t, err, "broker", "RedeliveryDeadline must be zero (none) or positive")
	})
	t.Run("no deadline", func(t *testing.T) {
		g := newGochannelBroker()
		defer g.ch.Close()
		cfg := Config{Broker: brokerCustom}
		cfg.Budget.AutoSize.Enabled, cfg.Budget.AutoSize.Ceiling = true, 1000
		has(t, newWith(t, cfg, WithBroker(g.custom(0))), "budget.autosize.deadline", "must be set")
	})
	t.Run("retries against the custom deadline", func(t *testing.T) {
		g := newGochannelBroker()
		defer g.ch.Close()
		cfg := Config{}
		cfg.Retry.MaxElapsedTime = 10 * time.Second // and more in the gate
		has(t, newWith(t, cfg, WithBroker(g.custom(5*time.Second))), "retry.max_elapsed_time", "CustomBroker.RedeliveryDeadline (5s)")
	})
	t.Run("lag settings need CustomBroker.Lag", func(t *testing.T) {
		g := newGochannelBroker()
		defer g.ch.Close()
		cfg := Config{}
		cfg.Shedding.Pressure, cfg.Telemetry.LagThreshold = pressureLag, 100
		cfg.Producer.LagThrottle.Threshold = 100
		err := newWith(t, cfg, WithBroker(g.custom(time.Minute)))
		has(t, err, "shedding.pressure", "set CustomBroker.Lag")
		has(t, err, "producer.lag_throttle.threshold", "set CustomBroker.Lag")
	})
	t.Run("lag and subscriber errors", func(t *testing.T) {
		g := newGochannelBroker()
		b := g.custom(time.Minute)
		b.Lag = telemetry.LagSource(func(context.Context) ([]telemetry.LagSample, error) {
			return []telemetry.LagSample{{Topic: "a", Lag: 3}, {Topic: "b", Lag: 4}}, nil
		})
		b.Subscriber = func(handler, topic string) (message.Subscriber, error) {
			return nil, errors.New("no such stream")
		}
		r, err := New(Config{}, nil, WithBroker(b))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if n, err := r.Lag(context.Background()); n != 7 || err != nil {
			t.Errorf("Lag = %d, %v; want 7 from CustomBroker.Lag", n, err)
		}
		if _, err := r.AddConsumerHandler("h", "t", func(*message.Message) error { return nil }); err == nil || !strings.Contains(err.Error(), "no such stream") {
			t.Errorf("AddConsumerHandler = %v, want the subscriber's error", err)
		}
	})
}
