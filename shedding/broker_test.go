package shedding_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/shedding"
)

// streamSub models how a broker hands one stream to one process: a fixed
// backlog consumed by `consumers` consumers, each of which holds one
// unacked message at a time (a nacked message is redelivered to the same
// consumer). consumers = 1 is a Kafka partition under watermill-kafka: one
// entity's messages (one key) arrive strictly one after another. consumers
// > 1 is a Redis Streams consumer group with several consumers in one
// process, where one entity's messages can wait side by side.
type streamSub struct {
	consumers int
	backlog   []*message.Message
	start     chan struct{} // closed by the test to begin delivery

	mu   sync.Mutex
	next int
	wg   sync.WaitGroup
}

func (s *streamSub) take() *message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next == len(s.backlog) {
		return nil
	}
	m := s.backlog[s.next]
	s.next++
	return m
}

func (s *streamSub) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	var consumers sync.WaitGroup
	for range s.consumers {
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			select {
			case <-s.start:
			case <-ctx.Done():
				return
			}
			for m := s.take(); m != nil; m = s.take() {
			redeliver:
				c := m.Copy()
				select {
				case out <- c:
				case <-ctx.Done():
					return
				}
				select {
				case <-c.Acked():
				case <-c.Nacked():
					goto redeliver
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		<-ctx.Done()
		consumers.Wait()
		close(out)
	}()
	return out, nil
}

func (s *streamSub) Close() error {
	s.wg.Wait()
	return nil
}

func update(uuid, entity string, version int) *message.Message {
	return msg(uuid, "entity_id", entity, "entity_version", strconv.Itoa(version), "region_priority", "5")
}

// Kafka: a keyed partition delivers one entity's messages one at a time, so
// there is never a second waiter to coalesce with. The version guard is what
// catches stale and duplicate deliveries.
func TestKafkaModelVersionGuardDoesTheWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := &streamSub{consumers: 1, start: make(chan struct{}), backlog: []*message.Message{
			update("v1", "bus-1", 1),
			update("v2", "bus-1", 2),
			update("v2-dup", "bus-1", 2), // produced twice
			update("v1-late", "bus-1", 1),
			update("v3", "bus-1", 3),
		}}
		r := newRig(t, fullConfig, sub, "vehicles")
		hold := r.hold()
		close(sub.start)
		time.Sleep(time.Minute) // sustained pressure; priority 5 is kept
		synctest.Wait()
		if w := r.budget.Stats().Waiting; w != 1 {
			t.Fatalf("%d waiting: a partition delivers one message at a time", w)
		}
		hold.Release()
		synctest.Wait()
		if got := fmt.Sprint(r.seen["vehicles"].uuids()); got != "[v1 v2 v3]" {
			t.Fatalf("handled %s", got)
		}
		st := r.stats("vehicles")
		if st.Superseded != 0 || st.StaleVersion != 2 {
			t.Fatalf("stats %+v: want nothing coalesced, two stale", st)
		}
	})
}

// Redis Streams with several consumers in one process: one entity's updates
// wait side by side, and coalescing lets only the newest through. Every
// superseded update is acked, so the consumers move on through the backlog.
func TestRedisModelCoalescing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const updates = 20
		var backlog []*message.Message
		for v := 1; v <= updates; v++ {
			backlog = append(backlog, update(fmt.Sprintf("v%d", v), "bus-1", v))
		}
		sub := &streamSub{consumers: 4, start: make(chan struct{}), backlog: backlog}
		r := newRig(t, fullConfig, sub, "vehicles")
		hold := r.hold()
		close(sub.start)
		synctest.Wait()
		if w := r.budget.Stats().Waiting; w != 1 {
			t.Fatalf("%d waiting, want only the newest", w)
		}
		hold.Release()
		synctest.Wait()
		if got := fmt.Sprint(r.seen["vehicles"].uuids()); got != fmt.Sprintf("[v%d]", updates) {
			t.Fatalf("handled %s", got)
		}
		if st := r.stats("vehicles"); st.Superseded != updates-1 || st.StaleVersion != 0 {
			t.Fatalf("stats %+v", st)
		}
		if len(r.audit.snapshot()) != updates-1 {
			t.Fatalf("audit %d", len(r.audit.snapshot()))
		}
	})
}

// The same stream without coalescing: every update waits and is handled in
// turn (the guard only drops what arrives after a newer one was handled).
func TestRedisModelWithoutCoalescing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var backlog []*message.Message
		for v := 1; v <= 8; v++ {
			backlog = append(backlog, update(fmt.Sprintf("v%d", v), "bus-1", v))
		}
		cfg := shedding.Config{Topics: []string{"vehicles"}, VersionGuard: shedding.VersionGuardConfig{Enabled: true}}
		sub := &streamSub{consumers: 4, start: make(chan struct{}), backlog: backlog}
		r := newRig(t, cfg, sub, "vehicles")
		hold := r.hold()
		close(sub.start)
		synctest.Wait()
		if w := r.budget.Stats().Waiting; w != 4 {
			t.Fatalf("%d waiting", w)
		}
		hold.Release()
		synctest.Wait()
		st := r.stats("vehicles")
		if n := uint64(r.seen["vehicles"].len()); n+st.StaleVersion != 8 || st.Superseded != 0 {
			t.Fatalf("handled %d, stats %+v", n, st)
		}
	})
}
