package kafkabroker

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// partitionTracker is the [SessionTracker] of watermill-kafka's
// subscriber (consumer partition): it learns which claim, and so which
// session, each delivered message comes from. The handler wrapper
// registers every claim before watermill-kafka reads from it
// (consumeClaim), and the unmarshaler, which watermill-kafka calls on the
// claim's goroutine before it hands the message to the router, records
// the offset in flight (trackedUnmarshaler).
type partitionTracker struct {
	st *SessionTracker

	mu     sync.Mutex
	claims map[topicPartition]*claimState // under mu; readers use claimsView
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
}

// newPartitionTracker returns the tracker of a watermill-kafka subscriber
// in consumer group group (see newSessionTracker).
func newPartitionTracker(inner kafka.SaramaTracer, group string, seen *offsetMemory) *partitionTracker {
	t := &partitionTracker{claims: make(map[topicPartition]*claimState)}
	t.st = newSessionTracker(inner, group, seen, t)
	return t
}

// wrapUnmarshaler returns u observing every message before watermill-kafka
// hands it to the router.
func (t *partitionTracker) wrapUnmarshaler(u kafka.Unmarshaler) kafka.Unmarshaler {
	return trackedUnmarshaler{t: t, next: u}
}

func (t *partitionTracker) revoked(msg *message.Message) <-chan struct{} {
	c, _, ok := t.lookup(msg)
	if !ok {
		return nil
	}
	return c.sess.Done()
}

func (t *partitionTracker) begin(msg *message.Message) {
	// A first attempt finds -1 already (the unmarshaler's); reading
	// first leaves the claim's cache line shared then.
	if c, _, ok := t.lookup(msg); ok && c.completed.Load() != -1 {
		c.completed.Store(-1)
	}
}

func (t *partitionTracker) completed(msg *message.Message) {
	if c, off, ok := t.lookup(msg); ok {
		if c.current.Load() == off {
			c.completed.Store(off)
		}
	}
}

func (t *partitionTracker) redelivered(msg *message.Message) bool {
	c, off, ok := t.lookup(msg)
	return ok && off <= c.seenBefore
}

// windows reports nothing: watermill-kafka keeps no window of its own.
func (t *partitionTracker) windows(func(*keyWindow[*keyDelivery]) (int64, int64), func(string, int32, int64, int64)) {
}

// consumeClaim registers the claim for as long as next consumes it, and
// hands next the session that keeps a completed message's late ack
// (trackedSession).
func (t *partitionTracker) consumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim, next sarama.ConsumerGroupHandler) error {
	key := topicPartition{claim.Topic(), claim.Partition()}
	gp := groupPartition{t.st.group, key}
	c := newClaimState(s.Context(), t.st.seen.highest(gp), t.st.seen.slot(gp))
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
	return next.ConsumeClaim(&trackedSession{ConsumerGroupSession: s, t: t.st, c: c}, claim)
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

// delivered is what partitionTracker.delivering holds for a message: the
// claim delivering it, at offset.
type delivered struct {
	msg    *message.Message
	c      *claimState
	offset int64
}

const deliveringShards = 16

// deliveringShard is one share of partitionTracker.delivering: the messages
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
func (t *partitionTracker) deliveringOf(msg *message.Message) *deliveringShard {
	return &t.delivering[maphash.Comparable(deliveringSeed, msg)%deliveringShards]
}

// deliveringSeed seeds deliveringOf's hash.
var deliveringSeed = maphash.MakeSeed()

// setDelivering records that d.c is delivering d.msg at d.offset; the
// message must not be recorded already.
func (t *partitionTracker) setDelivering(d delivered) {
	sh := t.deliveringOf(d.msg)
	sh.mu.Lock()
	sh.ds = append(sh.ds, d)
	sh.mu.Unlock()
}

// dropDelivering forgets msg.
func (t *partitionTracker) dropDelivering(msg *message.Message) {
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
func (t *partitionTracker) deliveringCount() int {
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
func (t *partitionTracker) setClaimLocked(key topicPartition, c, old *claimState) {
	if c != nil {
		t.claims[key] = c
	} else if t.claims[key] == old {
		delete(t.claims, key)
	} else {
		return
	}
	t.claimsView.Store(newClaimsView(t.claims))
}

func (t *partitionTracker) owns(tp topicPartition) bool { return t.claimOf(tp) != nil }

// claimOf returns the live claim of key, nil if none, without locking.
func (t *partitionTracker) claimOf(key topicPartition) *claimState {
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

// lookup finds the claim msg was delivered from and msg's offset, provided
// it is the message that claim is delivering now. The common case, a
// message the tracker's unmarshaler recorded, is found here; the rest in
// lookupByContext.
func (t *partitionTracker) lookup(msg *message.Message) (*claimState, int64, bool) {
	d, ok := t.deliveringOf(msg).delivering(msg)
	if !ok {
		return t.lookupByContext(msg)
	}
	return d.c, d.offset, d.c.current.Load() == d.offset
}

// lookupByContext is lookup for a message the unmarshaler did not record:
// its partition and offset are read from its context.
func (t *partitionTracker) lookupByContext(msg *message.Message) (*claimState, int64, bool) {
	ctx := msg.Context()
	partition, ok := PartitionFromCtx(ctx)
	if !ok {
		return nil, 0, false
	}
	offset, ok := OffsetFromCtx(ctx)
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
func (t *partitionTracker) lookupByOffset(partition int32, offset int64) (*claimState, bool) {
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
	t    *partitionTracker
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
		u.t.st.seen.receive(groupPartition{u.t.st.group, key}, m.Offset)
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
