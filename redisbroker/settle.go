package redisbroker

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// ackTable makes sure an Ack given before Close reaches Redis. Upstream
// asks for the XACK (which the acker then sends) on its own goroutine
// after the message's Ack, and skips it when the message's context ends or
// the subscriber closes first: a message acked just before Close (or just
// before Watermill's router cancels its subscriptions) would stay pending,
// and a peer would claim and redo finished work. Close settles such entries
// itself once upstream has stopped and the acker has sent its queue.
//
// Upstream hands over one message at a time per consumer name and stream,
// so the table keeps the last message handed over for each, and whether its
// XACK succeeded. Its size is bounded by consumer names × streams.
type ackTable struct {
	mu   sync.Mutex
	last map[ackSlot]*ackState
}

type ackSlot struct{ stream, consumer string }

type ackState struct {
	msg    *message.Message
	id     string
	xacked bool
}

// handed records msg, delivered from e, as the message now out with the
// subscriber's user.
func (t *ackTable) handed(msg *message.Message, e entry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last = make(map[ackSlot]*ackState)
	}
	slot := ackSlot{e.Stream, e.Consumer}
	if st := t.last[slot]; st != nil {
		*st = ackState{msg: msg, id: e.ID}
		return
	}
	t.last[slot] = &ackState{msg: msg, id: e.ID}
}

// xacked records a successful XACK of id on stream by consumer.
func (t *ackTable) xacked(stream, consumer, id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.last[ackSlot{stream, consumer}]; st != nil && st.id == id {
		st.xacked = true
	}
}

// settle acknowledges in Redis every entry whose message was acked but
// whose XACK has not succeeded. Call it once upstream has stopped. It
// returns the first error.
func (t *ackTable) settle(c redis.UniversalClient, k *keepAlive, group string, timeout time.Duration) error {
	t.mu.Lock()
	var todo []ackSlot
	var ids []string
	for slot, st := range t.last {
		if st.xacked {
			continue
		}
		select {
		case <-st.msg.Acked():
			todo = append(todo, slot)
			ids = append(ids, st.id)
		default:
		}
	}
	t.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var first error
	for i, slot := range todo {
		if err := ackOwned(ctx, c, k, slot.stream, group, slot.consumer, ids[i:i+1]).Err(); err != nil && first == nil {
			first = err
		} else if err == nil {
			t.xacked(slot.stream, slot.consumer, ids[i])
		}
	}
	return first
}
