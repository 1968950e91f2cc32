package retrygate

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var errTransient = errors.New("transient failure")

// recPub records every publish and can be told to fail some of them.
type recPub struct {
	inner message.Publisher // nil: record only

	mu   sync.Mutex
	msgs map[string][]*message.Message
	fail func(topic string) bool
	n    atomic.Int64 // successful publishes
}

func newRecPub(inner message.Publisher) *recPub {
	return &recPub{inner: inner, msgs: map[string][]*message.Message{}}
}

var errPublish = errors.New("broker unavailable")

func (p *recPub) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	fail := p.fail != nil && p.fail(topic)
	if !fail {
		for _, m := range msgs {
			p.msgs[topic] = append(p.msgs[topic], m.Copy())
		}
	}
	p.mu.Unlock()
	if fail {
		return errPublish
	}
	p.n.Add(int64(len(msgs)))
	if p.inner != nil {
		return p.inner.Publish(topic, msgs...)
	}
	return nil
}

func (p *recPub) Close() error { return nil }

func (p *recPub) setFail(f func(topic string) bool) {
	p.mu.Lock()
	p.fail = f
	p.mu.Unlock()
}

func (p *recPub) on(topic string) []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*message.Message(nil), p.msgs[topic]...)
}

// switchPressure is a Pressure a test turns on and off.
type switchPressure struct{ on atomic.Bool }

func (s *switchPressure) SaturatedFor() time.Duration {
	if s.on.Load() {
		return time.Second
	}
	return 0
}

// rig is a Watermill router on a persistent GoChannel consuming topic "in"
// and its retry topic through the same stack: the outer middlewares, the
// gate, the inner middlewares, then the handler. Build it inside a synctest bubble and
// close it before the bubble ends.
type rig struct {
	t      *testing.T
	ps     *gochannel.GoChannel
	pub    *recPub
	gate   *Gate
	router *message.Router
	done   chan struct{}
}

// layers are middlewares around (outer) and inside (inner) the gate.
type layers struct {
	outer, inner []message.HandlerMiddleware
}

func newRig(t *testing.T, cfg Config, opts []Option, h message.NoPublishHandlerFunc, l layers) *rig {
	t.Helper()
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	pub := newRecPub(ps)
	g, err := New(pub, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Minute}, logger)
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(l.outer...)
	r.AddMiddleware(g.Middleware)
	r.AddMiddleware(l.inner...)
	r.AddConsumerHandler("h", "in", ps, h)
	if g.cfg.Defer == DeferRepublish {
		r.AddConsumerHandler("h_retry", g.cfg.RetryTopicFor("in"), ps, h)
	}
	rg := &rig{t: t, ps: ps, pub: pub, gate: g, router: r, done: make(chan struct{})}
	go func() {
		defer close(rg.done)
		if err := r.Run(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	<-r.Running()
	return rg
}

func (rg *rig) close() {
	_ = rg.router.Close()
	<-rg.done
	_ = rg.ps.Close()
}

func (rg *rig) publish(msgs ...*message.Message) {
	rg.t.Helper()
	if err := rg.ps.Publish("in", msgs...); err != nil {
		rg.t.Fatal(err)
	}
}

// call runs mw around h for msg directly, without a router.
func call(mw message.HandlerMiddleware, h message.HandlerFunc, msg *message.Message) error {
	_, err := mw(h)(msg)
	return err
}

// noJitter is a config with a deterministic schedule: 1s, 2s, 4s, ...
func noJitter() Config {
	return Config{
		InitialInterval: time.Second,
		MaxInterval:     time.Minute,
		Multiplier:      2,
		Jitter:          spillway.Off,
		MaxElapsedTime:  time.Hour,
		RetryRate:       1000,
		RetryBurst:      1000,
		RetryTopic:      "retry",
		DeadLetterTopic: "dlq",
	}
}

// events collects OnOutcome events, and the context each event's message
// had during the call.
type events struct {
	mu   sync.Mutex
	ev   []Event
	ctxs []context.Context
}

func (e *events) add(ev Event) {
	var ctx context.Context
	if ev.Message != nil {
		ctx = ev.Message.Context()
	}
	e.mu.Lock()
	e.ev = append(e.ev, ev)
	e.ctxs = append(e.ctxs, ctx)
	e.mu.Unlock()
}

func (e *events) lastContext() context.Context {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.ctxs) == 0 {
		return nil
	}
	return e.ctxs[len(e.ctxs)-1]
}

func (e *events) all() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Event(nil), e.ev...)
}

// deliveries returns handled + deferred + deadLettered + nacked.
func (c counts) deliveries() uint64 { return c.handled + c.deferred + c.deadLettered + c.nacked }

// deliveries returns Handled + Deferred + DeadLettered + Nacked.
func (s Stats) deliveries() uint64 { return s.Handled + s.Deferred + s.DeadLettered + s.Nacked }

// byTopic returns every topic's counters.
func (t *topicCounters) byTopic() map[string]counts {
	m := make(map[string]counts)
	t.m.Range(func(k, v any) bool {
		m[k.(string)] = v.(*counters).snapshot()
		return true
	})
	return m
}
