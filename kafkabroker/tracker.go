package kafkabroker

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// SessionTracker makes budget admission on Kafka revocation-aware. It
// hooks into watermill-kafka as its tracer (the only hook into Sarama's
// consumer-group sessions) and as a wrapper of its unmarshaler;
// [Cluster.NewSubscriber] builds one per subscriber, and the router one per
// Kafka handler.
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
//     session). The router passes it to the retry gate and to coalescing,
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

	// observeOnly records sessions but neither revokes waiting messages
	// nor keeps a session live for late acks: stock watermill-kafka
	// behaviour ([WithObserveOnly]).
	observeOnly bool

	// keyed: the tracker of a [KeySubscriber], which keeps its deliveries'
	// state itself (in the message context) and commits itself.
	keyed bool

	mu       sync.Mutex
	claims   map[topicPartition]*claimState // under mu; readers use claimsView
	keyParts map[topicPartition]*keyPartition
	// claimsView is a copy of claims, replaced whenever claims changes
	// (a claim starts or ends: rare), so the per-message paths read it
	// without taking mu.
	claimsView atomic.Pointer[claimsView]
	// delivering maps the message each live claim is delivering now to
	// its claim and offset, so the hooks the router calls for every
	// message (Begin, Revoked, Completed) find the claim without reading
	// partition, offset and topic from the message context. A message it
	// does not hold (a copy resent after a nack) is looked up the long way.
	// Sharded by the message's address, so that the claims' goroutines
	// and the message goroutines do not queue for one lock.
	delivering [deliveringShards]deliveringShard

	ended       atomic.Uint64 // sessions whose context ended
	marked      atomic.Uint64 // acks marked after their session ended
	lastMember  atomic.Value  // string
	memberSwaps atomic.Uint64 // member id changed between sessions: evicted

	evMu   sync.Mutex
	events []SessionEvent
	onEv   func(SessionEvent)
}

// SessionEvent records one consumer-group session of one member, as the
// tracker saw it.
type SessionEvent struct {
	MemberID   string
	Generation int32
	Claims     int       // partitions claimed
	Started    time.Time // Setup
	Ended      time.Time // the session context ended (rebalance or close); zero while live
	Released   time.Time // Cleanup: every claim returned; zero while live
}

type topicPartition struct {
	topic     string
	partition int32
}

// newClaimState returns the state of a claim that has delivered nothing yet.
func newClaimState(sess context.Context, seenBefore int64, high *atomic.Int64) *claimState {
	c := &claimState{sess: sess, seenBefore: seenBefore, high: high}
	c.current.Store(-1)
	c.completed.Store(-1)
	return c
}

// claimState is one claimed partition of one session.
type claimState struct {
	sess context.Context

	// seenBefore is the highest offset of the partition that an earlier
	// session had received when this claim started, -1 none: a message at
	// or below it is a redelivery.
	seenBefore int64

	// current is the offset watermill-kafka is delivering, -1 before the
	// first; completed the offset whose handler succeeded in the current
	// attempt, -1 none. Atomics, not a lock: watermill-kafka delivers one
	// message of a claim at a time and moves on only once it is acked, so
	// the claim's goroutine and the message's never change them at once,
	// and every reader compares completed with current, which a stale
	// completed never matches. The message goroutine's reads then leave
	// the claim's cache line shared instead of taking it for a lock.
	current   atomic.Int64
	completed atomic.Int64

	msg *message.Message // the message unmarshalled for current; only the claim's goroutine uses it

	high *atomic.Int64 // the offset memory's slot of this claim's group and partition
}

// delivered is what SessionTracker.delivering holds for a message: the
// claim delivering it, at offset.
type delivered struct {
	msg    *message.Message
	c      *claimState
	offset int64
}

const deliveringShards = 16

// deliveringShard is one share of SessionTracker.delivering: the messages
// of the share being delivered, one per live claim at most, so a handful
// over all the shards. A short list scanned for the message's address
// costs less than a map's hashing and probing on every call, three of
// them per message on the message goroutine and two on the claim's.
type deliveringShard struct {
	mu sync.Mutex
	ds []delivered
	_  [32]byte // one shard per 64-byte cache line
}

// deliveringOf returns msg's shard of t.delivering, picked by a hash of
// msg's address (maphash.Comparable of a pointer hashes the pointer; heap
// objects do not move).
func (t *SessionTracker) deliveringOf(msg *message.Message) *deliveringShard {
	return &t.delivering[maphash.Comparable(deliveringSeed, msg)%deliveringShards]
}

// deliveringSeed seeds deliveringOf's hash.
var deliveringSeed = maphash.MakeSeed()

// setDelivering records that d.c is delivering d.msg at d.offset; the
// message must not be recorded already.
func (t *SessionTracker) setDelivering(d delivered) {
	sh := t.deliveringOf(d.msg)
	sh.mu.Lock()
	sh.ds = append(sh.ds, d)
	sh.mu.Unlock()
}

// dropDelivering forgets msg.
func (t *SessionTracker) dropDelivering(msg *message.Message) {
	sh := t.deliveringOf(msg)
	sh.mu.Lock()
	for i := range sh.ds {
		if sh.ds[i].msg == msg {
			last := len(sh.ds) - 1
			sh.ds[i] = sh.ds[last]
			sh.ds[last] = delivered{} // the message, and its payload, are garbage now
			sh.ds = sh.ds[:last]
			break
		}
	}
	sh.mu.Unlock()
}

// delivering returns what t holds for msg.
func (sh *deliveringShard) delivering(msg *message.Message) (delivered, bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, d := range sh.ds {
		if d.msg == msg {
			return d, true
		}
	}
	return delivered{}, false
}

// deliveringCount returns how many messages t holds as being delivered.
func (t *SessionTracker) deliveringCount() int {
	n := 0
	for i := range t.delivering {
		sh := &t.delivering[i]
		sh.mu.Lock()
		n += len(sh.ds)
		sh.mu.Unlock()
	}
	return n
}

// setClaimLocked registers c as the live claim of key, or, with c nil, removes
// key's claim if it is still old; it publishes the new claimsView. The
// caller holds t.mu.
func (t *SessionTracker) setClaimLocked(key topicPartition, c, old *claimState) {
	if c != nil {
		t.claims[key] = c
	} else if t.claims[key] == old {
		delete(t.claims, key)
	} else {
		return
	}
	t.claimsView.Store(newClaimsView(t.claims))
}

// claimOf returns the live claim of key, nil if none, without locking.
func (t *SessionTracker) claimOf(key topicPartition) *claimState {
	if v := t.claimsView.Load(); v != nil {
		return v.claim(key)
	}
	return nil
}

// claimsView is a read-only copy of a tracker's claims, indexed by
// partition: looking a claim up, twice for every message the tracker's
// unmarshaler sees, compares a topic or two instead of hashing it.
type claimsView struct {
	byPartition [][]topicClaim
}

type topicClaim struct {
	topic string
	c     *claimState
}

func newClaimsView(claims map[topicPartition]*claimState) *claimsView {
	v := new(claimsView)
	for k, c := range claims {
		if k.partition < 0 {
			continue // never claimed: Kafka's partitions count from 0
		}
		if n := int(k.partition) + 1; n > len(v.byPartition) {
			v.byPartition = append(v.byPartition, make([][]topicClaim, n-len(v.byPartition))...)
		}
		v.byPartition[k.partition] = append(v.byPartition[k.partition], topicClaim{k.topic, c})
	}
	return v
}

func (v *claimsView) claim(key topicPartition) *claimState {
	if key.partition < 0 || int(key.partition) >= len(v.byPartition) {
		return nil
	}
	for _, tc := range v.byPartition[key.partition] {
		if tc.topic == key.topic {
			return tc.c
		}
	}
	return nil
}

// newSessionTracker returns a tracker for consumer group group that
// composes inner, which may be nil, and remembers the offsets it receives
// in seen (a fresh memory if nil).
func newSessionTracker(inner kafka.SaramaTracer, group string, seen *offsetMemory) *SessionTracker {
	if seen == nil {
		seen = newOffsetMemory()
	}
	return &SessionTracker{inner: inner, group: group, seen: seen, claims: make(map[topicPartition]*claimState)}
}

// offsetMemory is, per consumer group and partition, the highest offset
// received by any session of a [Cluster]'s subscribers. Its size is bounded
// by the partitions consumed.
//
// Each entry is an atomic slot, so that a claim, which looks its slot up
// once, records every offset it receives without the memory's lock.
type offsetMemory struct {
	mu   sync.Mutex
	high map[groupPartition]*atomic.Int64
}

type groupPartition struct {
	group string
	topicPartition
}

func newOffsetMemory() *offsetMemory {
	return &offsetMemory{high: make(map[groupPartition]*atomic.Int64)}
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

// wrapUnmarshaler returns u observing every message before watermill-kafka
// hands it to the router.
func (t *SessionTracker) wrapUnmarshaler(u kafka.Unmarshaler) kafka.Unmarshaler {
	return trackedUnmarshaler{t: t, next: u}
}

// Revoked returns the channel that closes when msg's session ends, or nil
// if msg is not a delivery the tracker knows (then it cannot be revoked).
// Use it as [middleware.BudgetConfig.Revoked].
func (t *SessionTracker) Revoked(msg *message.Message) <-chan struct{} {
	if t.observeOnly {
		return nil
	}
	if d := t.keyDelivery(msg); d != nil {
		return d.p.sessDone
	}
	c, _, ok := t.lookup(msg)
	if !ok {
		return nil
	}
	return c.sess.Done()
}

// Begin starts a delivery attempt of msg: whatever a previous attempt of
// the same message completed no longer counts. The router calls it before
// budget admission.
func (t *SessionTracker) Begin(msg *message.Message) {
	if d := t.keyDelivery(msg); d != nil {
		d.completed.Store(false)
		return
	}
	// A first attempt finds -1 already (the unmarshaler's); reading
	// first leaves the claim's cache line shared then.
	if c, _, ok := t.lookup(msg); ok && c.completed.Load() != -1 {
		c.completed.Store(-1)
	}
}

// Completed records that msg's handler ran and succeeded in this attempt,
// so its ack may be committed even if the session ends before the ack
// arrives. The router calls it inside budget admission.
func (t *SessionTracker) Completed(msg *message.Message) {
	if d := t.keyDelivery(msg); d != nil {
		d.completed.Store(true)
		return
	}
	if c, off, ok := t.lookup(msg); ok {
		if c.current.Load() == off {
			c.completed.Store(off)
		}
	}
}

// Redelivered reports whether msg is a broker redelivery: an earlier
// session of a subscriber of the same [Cluster] and consumer group had
// already received its partition up to msg's offset or beyond. A message
// the tracker does not know (not a delivery it is making now) is not.
// Use it as retrygate.Options.IsRedelivery; the router does.
func (t *SessionTracker) Redelivered(msg *message.Message) bool {
	if d := t.keyDelivery(msg); d != nil {
		return d.rec.Offset <= d.p.seenBefore
	}
	c, off, ok := t.lookup(msg)
	return ok && off <= c.seenBefore
}

// keyDelivery returns msg's delivery when t is a [KeySubscriber]'s tracker
// and msg one of its messages in flight, nil otherwise.
func (t *SessionTracker) keyDelivery(msg *message.Message) *keyDelivery {
	if !t.keyed {
		return nil
	}
	if d := deliveryOf(msg); d != nil && d.p.h.s.tracker == t {
		return d
	}
	return nil
}

func (t *SessionTracker) registerKeyed(tp topicPartition, p *keyPartition) {
	t.mu.Lock()
	if t.keyParts == nil {
		t.keyParts = make(map[topicPartition]*keyPartition)
	}
	t.keyParts[tp] = p
	t.mu.Unlock()
}

func (t *SessionTracker) unregisterKeyed(tp topicPartition, p *keyPartition) {
	t.mu.Lock()
	if t.keyParts[tp] == p {
		delete(t.keyParts, tp)
	}
	t.mu.Unlock()
}

// lookup finds the claim msg was delivered from and msg's offset, provided
// it is the message that claim is delivering now. The common case, a
// message the tracker's unmarshaler recorded, is found here; the rest in
// lookupByContext.
func (t *SessionTracker) lookup(msg *message.Message) (*claimState, int64, bool) {
	d, ok := t.deliveringOf(msg).delivering(msg)
	if !ok {
		return t.lookupByContext(msg)
	}
	return d.c, d.offset, d.c.current.Load() == d.offset
}

// lookupByContext is lookup for a message the unmarshaler did not record:
// its partition and offset are read from its context.
func (t *SessionTracker) lookupByContext(msg *message.Message) (*claimState, int64, bool) {
	ctx := msg.Context()
	partition, ok := kafka.MessagePartitionFromCtx(ctx)
	if !ok {
		return nil, 0, false
	}
	offset, ok := kafka.MessagePartitionOffsetFromCtx(ctx)
	if !ok {
		return nil, 0, false
	}
	topic := message.SubscribeTopicFromCtx(ctx)
	if topic == "" {
		// Not delivered through a Watermill router, which is what puts
		// the topic in the context: find the one claim of that
		// partition delivering that offset.
		c, ok := t.lookupByOffset(partition, offset)
		return c, offset, ok
	}
	c := t.claimOf(topicPartition{topic, partition})
	if c == nil {
		return nil, 0, false
	}
	return c, offset, c.current.Load() == offset
}

// lookupByOffset finds the claim of partition that is delivering offset,
// provided exactly one is.
func (t *SessionTracker) lookupByOffset(partition int32, offset int64) (*claimState, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var found *claimState
	for k, c := range t.claims {
		if k.partition != partition {
			continue
		}
		if c.current.Load() == offset {
			if found != nil {
				return nil, false // two topics at the same offset: ambiguous
			}
			found = c
		}
	}
	return found, found != nil
}

// Window returns the records, and their bytes, in the windows of the
// partitions a [KeySubscriber] owns now: read and not yet committed. Zero
// for watermill-kafka's subscriber, which keeps no window of its own.
func (t *SessionTracker) Window() (records, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.keyParts {
		records += p.fill.Load()
		bytes += p.fillBytes.Load()
	}
	return records, bytes
}

// LateMarks returns how many acks were marked after their session had
// ended: admitted work that finished during a rebalance and was committed
// instead of being redelivered.
func (t *SessionTracker) LateMarks() uint64 { return t.marked.Load() }

// Evictions returns how many times the member came back from a rebalance
// under a new member id: the group had removed it (a late rebalance or a
// missed session timeout).
func (t *SessionTracker) Evictions() uint64 { return t.memberSwaps.Load() }

// Events returns a copy of the sessions seen so far, oldest first: one
// per session set up.
func (t *SessionTracker) Events() []SessionEvent {
	t.evMu.Lock()
	defer t.evMu.Unlock()
	return append([]SessionEvent(nil), t.events...)
}

func (t *SessionTracker) recordEvent(i int, f func(*SessionEvent)) {
	t.evMu.Lock()
	f(&t.events[i])
	ev := t.events[i]
	cb := t.onEv
	t.evMu.Unlock()
	if cb != nil {
		cb(ev)
	}
}

type trackedHandler struct {
	t    *SessionTracker
	next sarama.ConsumerGroupHandler

	mu    sync.Mutex
	event map[sarama.ConsumerGroupSession]int
}

func (h *trackedHandler) Setup(s sarama.ConsumerGroupSession) error {
	t := h.t
	member := s.MemberID()
	if prev, ok := t.lastMember.Load().(string); ok && prev != member {
		t.memberSwaps.Add(1)
	}
	t.lastMember.Store(member)
	n := 0
	for _, ps := range s.Claims() {
		n += len(ps)
	}
	t.evMu.Lock()
	t.events = append(t.events, SessionEvent{MemberID: member, Generation: s.GenerationID(), Claims: n, Started: time.Now()})
	i := len(t.events) - 1
	t.evMu.Unlock()
	h.mu.Lock()
	if h.event == nil {
		h.event = make(map[sarama.ConsumerGroupSession]int)
	}
	h.event[s] = i
	h.mu.Unlock()
	go func() {
		<-s.Context().Done()
		t.ended.Add(1)
		t.recordEvent(i, func(e *SessionEvent) { e.Ended = time.Now() })
	}()
	return h.next.Setup(s)
}

func (h *trackedHandler) Cleanup(s sarama.ConsumerGroupSession) error {
	err := h.next.Cleanup(s)
	h.mu.Lock()
	i, ok := h.event[s]
	delete(h.event, s)
	h.mu.Unlock()
	if ok {
		h.t.recordEvent(i, func(e *SessionEvent) { e.Released = time.Now() })
	}
	return err
}

func (h *trackedHandler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	key := topicPartition{claim.Topic(), claim.Partition()}
	t := h.t
	if t.keyed {
		return h.next.ConsumeClaim(s, claim)
	}
	gp := groupPartition{t.group, key}
	c := newClaimState(s.Context(), t.seen.highest(gp), t.seen.slot(gp))
	t.mu.Lock()
	t.setClaimLocked(key, c, nil)
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.setClaimLocked(key, nil, c)
		t.mu.Unlock()
		if c.msg != nil {
			t.dropDelivering(c.msg)
			c.msg = nil
		}
	}()
	if t.observeOnly {
		return h.next.ConsumeClaim(s, claim)
	}
	return h.next.ConsumeClaim(&trackedSession{ConsumerGroupSession: s, t: t, c: c}, claim)
}

// trackedSession is the session watermill-kafka sees. After the real
// session has ended, its context is reported live for exactly the ack of a
// message whose handler completed in this session, so that ack is marked
// (and committed when Sarama releases the session) instead of dropped.
// Everything else is the real session.
type trackedSession struct {
	sarama.ConsumerGroupSession
	t *SessionTracker
	c *claimState
}

func (s *trackedSession) Context() context.Context {
	real := s.ConsumerGroupSession.Context()
	if real.Err() == nil {
		return real
	}
	done := s.c.completed.Load()
	keep := done >= 0 && done == s.c.current.Load()
	if keep {
		return context.WithoutCancel(real)
	}
	return real
}

func (s *trackedSession) MarkMessage(msg *sarama.ConsumerMessage, metadata string) {
	late := s.ConsumerGroupSession.Context().Err() != nil
	s.c.completed.CompareAndSwap(msg.Offset, -1) // one ack, one mark
	s.ConsumerGroupSession.MarkMessage(msg, metadata)
	if late {
		s.t.marked.Add(1)
	}
}

type trackedUnmarshaler struct {
	t    *SessionTracker
	next kafka.Unmarshaler
}

// Unmarshal runs on the goroutine of the claim m comes from (watermill-kafka
// unmarshals in ConsumeClaim), so the claim's msg needs no lock.
func (u trackedUnmarshaler) Unmarshal(m *sarama.ConsumerMessage) (*message.Message, error) {
	key := topicPartition{m.Topic, m.Partition}
	c := u.t.claimOf(key)
	if c != nil && c.high != nil {
		raise(c.high, m.Offset)
	} else {
		u.t.seen.receive(groupPartition{u.t.group, key}, m.Offset)
	}
	if c != nil {
		if c.current.Load() != m.Offset {
			c.completed.Store(-1)
			c.current.Store(m.Offset)
		}
	}
	msg, err := u.next.Unmarshal(m)
	if c != nil {
		if c.msg != nil {
			u.t.dropDelivering(c.msg)
			c.msg = nil
		}
		if err == nil && msg != nil && u.t.claimOf(key) == c {
			c.msg = msg
			u.t.setDelivering(delivered{msg: msg, c: c, offset: m.Offset})
		}
	}
	return msg, err
}

var _ kafka.SaramaTracer = sessionTracer{}
