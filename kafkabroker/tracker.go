package kafkabroker

import (
	"sync"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// SessionTracker makes budget admission on Kafka revocation-aware. It
// hooks into watermill-kafka as its tracer (the only hook into Sarama's
// consumer-group sessions) and as a wrapper of its unmarshaler;
// [Cluster.NewSubscriber] builds one per subscriber, and the router one per
// Kafka handler. In consumer key the subscriber keeps each delivery's
// state and the tracker reads it from the message's context; what follows
// holds in both modes.
//
// The problem it solves: watermill-kafka delivers one message per claimed
// partition and waits for its ack, so during a rebalance every delivered
// message, admitted or still waiting for budget, holds the member's
// partitions until it is acked; the rebalance then lasts as long as all of
// them together, and past kafka.rebalance_timeout the member is evicted and
// everything in flight is redelivered. And an ack that arrives after the
// session ended is not committed at all.
//
// What it does:
//
//   - It learns which session (and so which session context) each
//     delivered message belongs to: the handler wrapper registers every
//     claim before watermill-kafka reads from it, and the unmarshaler,
//     which watermill-kafka calls on the claim's goroutine before it hands
//     the message to the router, records the offset in flight.
//   - [SessionTracker.Revoked] gives the budget the session's Done channel,
//     so a message still waiting for budget when its session ends steps
//     aside at once: acked without running the handler. watermill-kafka
//     does not commit that ack, so the partition's next owner processes it.
//   - Admitted work finishes. When its handler has succeeded
//     ([SessionTracker.Completed]), the session that watermill-kafka sees
//     still reports itself live for that one ack, so the offset is marked
//     and then committed when Sarama releases the session, before the
//     member rejoins. Without this the message would be processed a second
//     time by the next owner. Marking is only done for messages whose
//     handler ran to success in this delivery attempt.
//   - [SessionTracker.Redelivered] tells broker redeliveries from fresh
//     messages: a message at or below the highest offset that an earlier
//     session of the same [Cluster] had already received for its group and
//     partition (an uncommitted message handed out again after a
//     rebalance, a restart of the subscriber or a nack that outlived its
//     session); in consumer key, only a record whose handler failed in
//     such a session. The router passes it to the retry gate and to coalescing,
//     so a saturated consumer sheds that work before fresh work and it
//     never supersedes a newer message.
//
// An inner tracer (e.g. kafka.NewOTELSaramaTracer()) is composed, not
// replaced: it wraps the consumer group handler around ours, and every
// other hook is delegated to it.
//
// A SessionTracker is safe for concurrent use; give each subscriber its
// own.
type SessionTracker struct {
	inner kafka.SaramaTracer
	group string
	seen  *offsetMemory

	// mode finds a message's delivery: a *partitionTracker for
	// watermill-kafka's subscriber, a *keyTracker for a keySubscriber.
	mode deliveries

	marked      atomic.Uint64 // acks marked after their session ended
	lastMember  atomic.Value  // string
	memberSwaps atomic.Uint64 // member id changed between sessions: evicted
}

// deliveries is what the two consumer modes track differently: how a
// message is found to be a delivery of a live session, and what windows
// there are. The SessionTracker keeps what they share: the sessions seen,
// the offsets received, the late marks.
type deliveries interface {
	// revoked, begin, completed and redelivered are Revoked, Begin,
	// Completed and Redelivered of the tracker.
	revoked(msg *message.Message) <-chan struct{}
	begin(msg *message.Message)
	completed(msg *message.Message)
	redelivered(msg *message.Message) bool
	// consumeClaim runs next's ConsumeClaim of claim in session s.
	consumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim, next sarama.ConsumerGroupHandler) error
	// windows calls f with what read returns for the window of every
	// partition owned now, in topic and partition order.
	windows(read func(*keyWindow[*keyDelivery]) (int64, int64), f func(topic string, partition int32, records, bytes int64))
	// owns reports whether the member consumes the partition now.
	owns(tp topicPartition) bool
}

type topicPartition struct {
	topic     string
	partition int32
}

// newSessionTracker returns a tracker for consumer group group that
// composes inner, which may be nil, remembers the offsets it receives in
// seen (a fresh memory if nil), and finds deliveries with mode
// (newPartitionTracker and newKeyTracker call it).
func newSessionTracker(inner kafka.SaramaTracer, group string, seen *offsetMemory, mode deliveries) *SessionTracker {
	if seen == nil {
		seen = newOffsetMemory()
	}
	return &SessionTracker{inner: inner, group: group, seen: seen, mode: mode}
}

// offsetMemory is, per consumer group and partition, the highest offset
// received by any session of a [Cluster]'s subscribers. Its size is bounded
// by the partitions consumed.
//
// Each entry is an atomic slot, so that a claim, which looks its slot up
// once, records every offset it receives without the memory's lock.
//
// In consumer key it keeps, instead, the offsets whose handler failed
// (failed): there records are handed over out of offset order, and one
// handed over may step aside without running, so the highest offset says
// nothing about the records below it.
type offsetMemory struct {
	mu     sync.Mutex
	high   map[groupPartition]*atomic.Int64
	failed map[groupPartition]map[int64]struct{}
}

type groupPartition struct {
	group string
	topicPartition
}

func newOffsetMemory() *offsetMemory {
	return &offsetMemory{high: make(map[groupPartition]*atomic.Int64), failed: make(map[groupPartition]map[int64]struct{})}
}

// fail records that a handler failed offset of k (consumer key).
func (m *offsetMemory) fail(k groupPartition, offset int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.failed[k]
	if set == nil {
		set = make(map[int64]struct{})
		m.failed[k] = set
	}
	set[offset] = struct{}{}
}

// forget drops the failed offsets of k below committed: the group will not
// hand them out again.
func (m *offsetMemory) forget(k groupPartition, committed int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgetLocked(k, committed)
}

func (m *offsetMemory) forgetLocked(k groupPartition, committed int64) {
	set := m.failed[k]
	for off := range set {
		if off < committed {
			delete(set, off)
		}
	}
	if len(set) == 0 {
		delete(m.failed, k)
	}
}

// failedFrom returns a copy of the failed offsets of k at or beyond
// committed, nil if none, and forgets those below it.
func (m *offsetMemory) failedFrom(k groupPartition, committed int64) map[int64]struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgetLocked(k, committed)
	set := m.failed[k]
	if len(set) == 0 {
		return nil
	}
	out := make(map[int64]struct{}, len(set))
	for off := range set {
		out[off] = struct{}{}
	}
	return out
}

// highest returns the highest offset received for k, -1 none.
func (m *offsetMemory) highest(k groupPartition) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.high[k]; ok {
		return v.Load()
	}
	return -1
}

// slot returns k's slot, created holding -1 (none received) if k has none.
func (m *offsetMemory) slot(k groupPartition) *atomic.Int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.high[k]
	if !ok {
		v = new(atomic.Int64)
		v.Store(-1)
		m.high[k] = v
	}
	return v
}

// receive records that offset of k was received.
func (m *offsetMemory) receive(k groupPartition, offset int64) {
	raise(m.slot(k), offset)
}

// raise sets v to offset if offset is higher.
func raise(v *atomic.Int64, offset int64) {
	for {
		cur := v.Load()
		if offset <= cur || v.CompareAndSwap(cur, offset) {
			return
		}
	}
}

// sessionTracer is the watermill-kafka tracer of a SessionTracker: the
// hook into Sarama's consumer-group sessions, kept off the tracker's own
// method set.
type sessionTracer struct{ *SessionTracker }

// tracer returns t as the tracer watermill-kafka calls.
func (t *SessionTracker) tracer() kafka.SaramaTracer { return sessionTracer{t} }

// WrapConsumer delegates to the inner tracer.
func (t sessionTracer) WrapConsumer(c sarama.Consumer) sarama.Consumer {
	if t.inner != nil {
		return t.inner.WrapConsumer(c)
	}
	return c
}

// WrapPartitionConsumer delegates to the inner tracer.
func (t sessionTracer) WrapPartitionConsumer(pc sarama.PartitionConsumer) sarama.PartitionConsumer {
	if t.inner != nil {
		return t.inner.WrapPartitionConsumer(pc)
	}
	return pc
}

// WrapSyncProducer delegates to the inner tracer.
func (t sessionTracer) WrapSyncProducer(cfg *sarama.Config, p sarama.SyncProducer) sarama.SyncProducer {
	if t.inner != nil {
		return t.inner.WrapSyncProducer(cfg, p)
	}
	return p
}

// WrapConsumerGroupHandler wraps h so that the tracker sees every session
// and claim. The inner tracer, if any, wraps the result.
func (t sessionTracer) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	var out sarama.ConsumerGroupHandler = &trackedHandler{t: t.SessionTracker, next: h}
	if t.inner != nil {
		out = t.inner.WrapConsumerGroupHandler(out)
	}
	return out
}

// Revoked returns the channel that closes when msg's session ends, or nil
// if msg is not a delivery the tracker knows (then it cannot be revoked).
// Use it with [middleware.WithRevoked].
func (t *SessionTracker) Revoked(msg *message.Message) <-chan struct{} {
	return t.mode.revoked(msg)
}

// Begin starts a delivery attempt of msg: whatever a previous attempt of
// the same message completed no longer counts. The router calls it before
// budget admission.
func (t *SessionTracker) Begin(msg *message.Message) { t.mode.begin(msg) }

// Completed records that msg's handler ran and succeeded in this attempt,
// so its ack may be committed even if the session ends before the ack
// arrives. The router calls it inside budget admission.
func (t *SessionTracker) Completed(msg *message.Message) { t.mode.completed(msg) }

// Redelivered reports whether msg is a broker redelivery: an earlier
// session of a subscriber of the same [Cluster] and consumer group had
// already received its partition up to msg's offset or beyond. In
// consumer key it is narrower: an earlier session handed msg's record to
// a handler that failed it (nacked it). A record that was only read,
// waited behind its key, or was handed over and stepped aside (acked
// after its session ended without [SessionTracker.Completed]) never ran,
// and is fresh work. A message the tracker does not know (not a delivery
// it is making now) is not a redelivery. Pass it to
// retrygate.WithRedelivery; the router does.
func (t *SessionTracker) Redelivered(msg *message.Message) bool { return t.mode.redelivered(msg) }

// Window returns the records, and their bytes, in the windows of the
// partitions a keySubscriber owns now: read and not yet finished. Zero
// for watermill-kafka's subscriber, which keeps no window of its own.
func (t *SessionTracker) Window() (records, bytes int64) {
	t.mode.windows((*keyWindow[*keyDelivery]).inWindow, func(_ string, _ int32, r, b int64) {
		records += r
		bytes += b
	})
	return records, bytes
}

// PartitionWindows calls f with the window of every partition the member
// owns now in consumer key, in topic and partition order: the records
// read and not yet finished, and their bytes (Config.WindowMessages and
// Config.WindowBytes bound them). It calls f for no partition with
// consumer partition, or before the member owns any. [SessionTracker.Window]
// is their sum. f runs after the tracker's lock is released.
func (t *SessionTracker) PartitionWindows(f func(topic string, partition int32, records, bytes int64)) {
	t.mode.windows((*keyWindow[*keyDelivery]).inWindow, f)
}

// PartitionReadAheads is [SessionTracker.PartitionWindows] for the
// read-ahead: the records of each partition read and waiting for room in
// the window, and their bytes. Reading a partition pauses when its
// read-ahead reaches 32 times Config.WindowMessages records or
// Config.WindowBytes bytes.
func (t *SessionTracker) PartitionReadAheads(f func(topic string, partition int32, records, bytes int64)) {
	t.mode.windows((*keyWindow[*keyDelivery]).readAheadFill, f)
}

// Owns reports whether the member consumes partition of topic now: the
// group assigned it to this member in the current session. The router
// estimates the backlog in vertices of owned partitions only in its
// background sampler, so that a fleet reads each partition once.
func (t *SessionTracker) Owns(topic string, partition int32) bool {
	return t.mode.owns(topicPartition{topic, partition})
}

// LateMarks returns how many acks were marked after their session had
// ended: admitted work that finished during a rebalance and was committed
// instead of being redelivered.
func (t *SessionTracker) LateMarks() uint64 { return t.marked.Load() }

// Evictions returns how many times the member came back from a rebalance
// under a new member id: the group had removed it (a late rebalance or a
// missed session timeout).
func (t *SessionTracker) Evictions() uint64 { return t.memberSwaps.Load() }

// trackedHandler is the consumer group handler watermill-kafka (or the
// key subscriber) runs, wrapped so that the tracker sees every session
// and claim.
type trackedHandler struct {
	t    *SessionTracker
	next sarama.ConsumerGroupHandler
}

// Setup counts an eviction when the member comes back under a new id.
func (h *trackedHandler) Setup(s sarama.ConsumerGroupSession) error {
	t := h.t
	member := s.MemberID()
	if prev, ok := t.lastMember.Load().(string); ok && prev != member {
		t.memberSwaps.Add(1)
	}
	t.lastMember.Store(member)
	return h.next.Setup(s)
}

func (h *trackedHandler) Cleanup(s sarama.ConsumerGroupSession) error { return h.next.Cleanup(s) }

func (h *trackedHandler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	return h.t.mode.consumeClaim(s, claim, h.next)
}

var _ kafka.SaramaTracer = sessionTracer{}
