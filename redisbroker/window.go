package redisbroker

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// handWindow lets each consumer hand over up to Config.Window messages
// before the first of them is settled.
//
// Upstream hands over one message per consumer and waits for its ack or
// nack before it reads on. A message waiting for budget therefore holds
// its consumer: with light and heavy messages on one stream, every
// consumer ends up holding a heavy message that waits, and the light ones
// behind it never reach their budget lane. Entries of a consumer group
// carry no order between them, so nothing forbids handing over more.
//
// With a window, the subscriber hands over its own copy of each message
// upstream delivers and acks upstream's at once, so upstream reads the
// next entry; that ack never reaches Redis (entryClient.XAck skips it).
// The window holds the entry instead, until the copy is settled:
//   - ack: the entry is acknowledged through the acker, exactly as an
//     upstream ack would be (owner-checked, never for a message that
//     stepped aside after a revocation);
//   - nack: a new copy is handed over after NackResendSleep, counted as
//     one more delivery, as upstream does;
//   - the subscription ends or the subscriber closes: the entry stays
//     pending (an ack given before Close still reaches Redis, see
//     flushAcked).
//
// The keep-alive tracks the entry from delivery to XACK as before, and
// revocation finds the copy (keepAlive.attempt). A consumer that keeps
// acking some messages no longer shows as stuck when another one hangs,
// so each message handed over gets KeepAlive.MaxInFlight on its own: past
// it, its entry is revoked and no longer kept alive, and a peer claims it
// MaxIdleTime later.
type handWindow struct {
	mu sync.Mutex
	// released counts, per entry, upstream acks the window gave that
	// must not reach Redis.
	released map[kaKey]int
	// held are the messages handed over and not yet settled.
	held map[*message.Message]heldEntry
}

// heldEntry is what the window needs to acknowledge a held message.
type heldEntry struct {
	sub *subscription
	key kaKey
}

func newHandWindow() *handWindow {
	return &handWindow{released: make(map[kaKey]int), held: make(map[*message.Message]heldEntry)}
}

// release records that upstream is about to acknowledge key for a message
// the window holds: that acknowledgement is skipped.
func (w *handWindow) release(key kaKey) {
	w.mu.Lock()
	w.released[key]++
	w.mu.Unlock()
}

// unreleased returns the ids upstream asks to acknowledge that the window
// did not release: those go to Redis.
func (w *handWindow) unreleased(stream, consumer string, ids []string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	keep := make([]string, 0, len(ids))
	for _, id := range ids {
		key := kaKey{stream: stream, id: id, consumer: consumer}
		if n := w.released[key]; n > 0 {
			if n == 1 {
				delete(w.released, key)
			} else {
				w.released[key] = n - 1
			}
			continue
		}
		keep = append(keep, id)
	}
	return keep
}

// hold records msg as handed over for key, replacing the message it was
// a new attempt of (nil for a first attempt).
func (w *handWindow) hold(msg, prev *message.Message, h heldEntry) {
	w.mu.Lock()
	delete(w.held, prev)
	w.held[msg] = h
	w.mu.Unlock()
}

// drop forgets msg without acknowledging it: its entry stays pending.
func (w *handWindow) drop(msg *message.Message) {
	w.mu.Lock()
	delete(w.held, msg)
	w.mu.Unlock()
}

// acked queues the acknowledgement of msg's entry, once.
func (w *handWindow) acked(msg *message.Message, a *acker) {
	w.mu.Lock()
	defer w.mu.Unlock() // held while queueing: flushAcked finds it queued or not held
	if h, ok := w.held[msg]; ok {
		delete(w.held, msg)
		a.enqueue(h.sub, h.key.stream, h.key.consumer, h.key.id)
	}
}

// flushAcked queues the acknowledgement of every held message acked by
// now whose ack was not queued yet. Close calls it once upstream has
// stopped and before the acker's last flush, so that an Ack given before
// Close reaches Redis.
func (w *handWindow) flushAcked(a *acker) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for msg, h := range w.held {
		select {
		case <-msg.Acked():
			delete(w.held, msg)
			a.enqueue(h.sub, h.key.stream, h.key.consumer, h.key.id)
		default:
		}
	}
}

// forwardWindow is forward with a window: it moves messages from one
// consumer to the shared channel, handing over up to Config.Window of
// them before the first is settled (see handWindow).
func (s *Subscriber) forwardWindow(ctx context.Context, in <-chan *message.Message, out chan<- *message.Message) {
	slots := make(chan struct{}, s.cfg.Window)
	sub := subscriptionOf(ctx)
	for up := range in {
		e, ok := entryOf(up)
		if !ok {
			// Not an entry of this subscriber (cannot happen): handed
			// over as upstream gave it.
			select {
			case out <- up:
			case <-s.closing:
			case <-ctx.Done():
			}
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-s.closing:
			continue // dropped unacked: it stays pending
		case <-ctx.Done():
			continue
		}
		key := kaKey{stream: e.Stream, id: e.ID, consumer: e.Consumer}
		msg := up.Copy()
		cancel := setCancelable(ctx, msg)
		// Recorded before the handover: the ack can come before this
		// goroutine runs again.
		s.window.hold(msg, nil, heldEntry{sub: sub, key: key})
		s.keepAlive.attempt(key, msg)
		select {
		case out <- msg:
		case <-s.closing:
			s.window.drop(msg)
			s.keepAlive.withdraw(key, msg)
			cancel()
			<-slots
			continue
		case <-ctx.Done():
			s.window.drop(msg)
			s.keepAlive.withdraw(key, msg)
			cancel()
			<-slots
			continue
		}
		s.window.release(key)
		up.Ack() // upstream reads on; its XACK is skipped
		go func() {
			defer func() { <-slots }()
			s.settleHeld(ctx, msg, key, cancel, out)
		}()
	}
}

// settleHeld waits until msg, handed over for key, is settled: an ack is
// queued for Redis, a nack hands over a new copy (one more delivery). It
// returns when msg is acked, or when the subscription or the subscriber
// ends first: the entry then stays pending, and an ack given before Close
// still reaches Redis (flushAcked). cancel ends msg's context.
func (s *Subscriber) settleHeld(ctx context.Context, msg *message.Message, key kaKey, cancel context.CancelFunc, out chan<- *message.Message) {
	defer func() { cancel() }()
	var expire <-chan time.Time
	if !s.cfg.KeepAlive.Disabled {
		t := time.NewTimer(s.cfg.KeepAlive.MaxInFlight)
		defer t.Stop()
		expire = t.C
	}
	sub := subscriptionOf(ctx)
	delivered := int64(max(Deliveries(msg), 1))
	for {
		select {
		case <-msg.Acked():
			s.window.acked(msg, s.acker)
			return
		case <-msg.Nacked():
			if !s.pauseNack(ctx) {
				s.window.drop(msg)
				return
			}
			next := msg.Copy()
			cancel()
			cancel = setCancelable(ctx, next)
			if s.nacks {
				delivered++
				setDeliveries(next, delivered, s.cfg.MaxDeliveries)
			}
			s.window.hold(next, msg, heldEntry{sub: sub, key: key})
			msg = next
			s.keepAlive.attempt(key, msg)
			select {
			case out <- msg:
			case <-s.closing:
				s.window.drop(msg)
				return
			case <-ctx.Done():
				s.window.drop(msg)
				return
			}
		case <-expire:
			expire = nil
			s.keepAlive.expireHeld(key)
		case <-s.closing:
			return // Close queues the ack if msg was acked by then
		case <-ctx.Done():
			// The subscription ended: nobody hands msg over again, but
			// its handler may still ack it.
			select {
			case <-msg.Acked():
				s.window.acked(msg, s.acker)
			case <-msg.Nacked():
				s.window.drop(msg)
			case <-s.closing:
			}
			return
		}
	}
}

// setCancelable gives msg a context of its own under ctx and returns
// what ends it.
func setCancelable(ctx context.Context, msg *message.Message) context.CancelFunc {
	mctx, cancel := context.WithCancel(ctx)
	msg.SetContext(mctx)
	return cancel
}

// pauseNack waits NackResendSleep before a nacked message is handed over
// again; false if the subscription or the subscriber ended meanwhile.
func (s *Subscriber) pauseNack(ctx context.Context) bool {
	if d := s.cfg.NackResendSleep; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.closing:
			return false
		case <-ctx.Done():
			return false
		}
	}
	select {
	case <-s.closing:
		return false
	case <-ctx.Done():
		return false
	default:
		return true
	}
}

// expireHeld lets key go: a message of a window has been out for
// KeepAlive.MaxInFlight. Its entry is no longer kept alive and is
// revoked, so a peer claims it MaxIdleTime later, as the entries of a
// stuck consumer.
func (k *keepAlive) expireHeld(key kaKey) {
	if k.disabled {
		return
	}
	k.mu.Lock()
	kept := k.revokeLocked(key)
	k.mu.Unlock()
	if !kept {
		return
	}
	k.expired.Add(1)
	k.logger.Info("Message made no progress for KeepAlive.MaxInFlight; its entry is no longer kept alive and a peer will claim it",
		watermill.LogFields{"stream": key.stream, "xid": key.id, "consumer": key.consumer})
}
