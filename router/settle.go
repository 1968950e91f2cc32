package router

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/stackroom"
)

// settling follows each message from the moment it enters the stack until
// Watermill has acked or nacked it. Watermill publishes a handler's produced
// messages and acks (or nacks) the delivered one only after every
// middleware has returned, so a message whose work is done is still
// unsettled for a while; if the subscriber closed in that window, its ack
// would be lost and the broker would redeliver finished work. Close waits
// for settling before it closes anything.
//
// Messages held at the shutdown gate (they arrived after Close started and
// wait there, unprocessed, until their subscriber closes) are counted apart:
// Close must not wait for them.
type settling struct {
	inside atomic.Int64 // messages inside the stack
	held   atomic.Int64 // of which held at the shutdown gate

	mu    sync.Mutex
	left  []*message.Message // left the stack, maybe not settled yet
	limit int                // prune left when it reaches this length
}

// layer is the outermost middleware: it counts the message inside and, on
// the way out, keeps it until it is settled. Being outermost, it also grows
// the message goroutine's stack for the layers below while that is cheap
// (internal/stackroom).
func (s *settling) layer(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		stackroom.Reserve()
		s.inside.Add(1)
		defer func() {
			s.leave(msg)
			s.inside.Add(-1)
		}()
		return h(msg)
	}
}

func (s *settling) leave(msg *message.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.left) >= s.limit {
		s.pruneLocked()
		// Doubling keeps the pruning's cost constant per message however
		// many messages are unsettled at once.
		s.limit = max(64, 2*len(s.left))
	}
	s.left = append(s.left, msg)
}

// isSettled reports whether Watermill has acked or nacked msg.
func isSettled(msg *message.Message) bool {
	select {
	case <-msg.Acked():
		return true
	case <-msg.Nacked():
		return true
	default:
		return false
	}
}

func (s *settling) pruneLocked() {
	keep := s.left[:0]
	for _, m := range s.left {
		if !isSettled(m) {
			keep = append(keep, m)
		}
	}
	clear(s.left[len(keep):])
	s.left = keep
}

// wait blocks until every message that entered the stack, except those
// held at the shutdown gate, has left it and been acked or nacked, or
// until deadline. It returns how many were still unsettled.
func (s *settling) wait(deadline time.Time) int64 {
	for {
		s.mu.Lock()
		s.pruneLocked()
		n := int64(len(s.left)) + s.inside.Load() - s.held.Load()
		s.mu.Unlock()
		if n <= 0 {
			return 0
		}
		if time.Now().After(deadline) {
			return n
		}
		time.Sleep(2 * time.Millisecond)
	}
}
