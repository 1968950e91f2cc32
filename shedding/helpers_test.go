package shedding_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/shedding"
)

// dropped returns a topic's drops for every reason.
func dropped(s shedding.TopicStats) uint64 { return s.ShedPriority + s.StaleVersion + s.Superseded }

// droppedAll returns the drops of every topic for every reason.
func droppedAll(p *shedding.Policy) uint64 {
	var n uint64
	for _, t := range shedding.Topics(p) {
		n += dropped(t)
	}
	return n
}

// fakePressure is a pressure signal the test sets by hand.
type fakePressure struct{ d atomic.Int64 }

func (f *fakePressure) SaturatedFor() time.Duration { return time.Duration(f.d.Load()) }
func (f *fakePressure) set(d time.Duration)         { f.d.Store(int64(d)) }

// auditLog is a publisher that keeps what it is given, or fails.
type auditLog struct {
	mu    sync.Mutex
	msgs  []*message.Message
	topic []string
	fail  bool
}

var errAuditDown = errors.New("audit broker down")

func (a *auditLog) Publish(topic string, msgs ...*message.Message) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail {
		return errAuditDown
	}
	for _, m := range msgs {
		a.msgs = append(a.msgs, m)
		a.topic = append(a.topic, topic)
	}
	return nil
}

func (a *auditLog) Close() error { return nil }

func (a *auditLog) setFail(f bool) {
	a.mu.Lock()
	a.fail = f
	a.mu.Unlock()
}

func (a *auditLog) snapshot() []*message.Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*message.Message(nil), a.msgs...)
}

// msg builds a message from a UUID and metadata pairs.
func msg(uuid string, kv ...string) *message.Message {
	m := message.NewMessage(uuid, []byte(uuid))
	for i := 0; i+1 < len(kv); i += 2 {
		m.Metadata.Set(kv[i], kv[i+1])
	}
	return m
}

// handled collects the messages a handler saw.
type handled struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (h *handled) add(m *message.Message) {
	h.mu.Lock()
	h.msgs = append(h.msgs, m)
	h.mu.Unlock()
}

func (h *handled) uuids() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, len(h.msgs))
	for i, m := range h.msgs {
		out[i] = m.UUID
	}
	return out
}

func (h *handled) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.msgs)
}

func uuidsOf(msgs []*message.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.UUID
	}
	return out
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	count := map[string]int{}
	for _, s := range a {
		count[s]++
	}
	for _, s := range b {
		count[s]--
		if count[s] < 0 {
			return false
		}
	}
	return true
}

// countRevoked returns an admission hook that counts the admissions that
// stepped aside.
func countRevoked(n *atomic.Uint64) func(*message.Message, middleware.Admission) {
	return func(_ *message.Message, a middleware.Admission) {
		if a.Result == middleware.Revoked {
			n.Add(1)
		}
	}
}

// wrap returns a middleware that runs the policy's stage before
// admission, then admission, then its stage after admission, as a router
// that adds pol.Middleware, admission and pol.Admitted in that order does.
func wrap(pol *shedding.Policy, admission message.HandlerMiddleware) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return pol.Middleware(admission(pol.Admitted(h)))
	}
}
