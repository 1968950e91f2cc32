package kafkabroker

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// The tracker finds the claim of the message it is delivering by the
// message itself, agrees with the lookup through the message context (what
// a copy resent after a nack gets), and holds one message per live claim.
func TestTrackerDeliveringByMessage(t *testing.T) {
	tr := newPartitionTracker(nil, "g", nil)
	key := topicPartition{"t", 3}
	c := newClaimState(context.Background(), 4, nil)
	tr.mu.Lock()
	tr.setClaimLocked(key, c, nil)
	tr.mu.Unlock()
	u := tr.wrapUnmarshaler(kafka.DefaultMarshaler{})

	deliver := func(offset int64) *message.Message {
		t.Helper()
		sm, err := kafka.DefaultMarshaler{}.Marshal("t", message.NewMessage("m", []byte("{}")))
		if err != nil {
			t.Fatal(err)
		}
		msg, err := u.Unmarshal(&sarama.ConsumerMessage{Topic: "t", Partition: 3, Offset: offset, Value: []byte("{}"), Headers: toRecordHeaders(sm.Headers)})
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}

	first := deliver(4)
	if got, off, ok := tr.lookup(first); !ok || got != c || off != 4 {
		t.Fatalf("lookup(first) = %p, %d, %v; want the claim at offset 4", got, off, ok)
	}
	if !tr.st.Redelivered(first) {
		t.Fatal("offset 4 was seen by an earlier session: want a redelivery")
	}
	tr.st.Begin(first)
	tr.st.Completed(first)
	if c.completed.Load() != 4 {
		t.Fatalf("completed = %d, want 4", c.completed.Load())
	}
	// A new attempt of the same message (the retry gate's) starts
	// uncompleted.
	tr.st.Begin(first)
	if c.completed.Load() != -1 {
		t.Fatalf("completed = %d after a new attempt began, want -1", c.completed.Load())
	}
	tr.st.Completed(first)

	second := deliver(5)
	if n := tr.deliveringCount(); n != 1 {
		t.Fatalf("tracker holds %d messages, want 1 (the claim's current)", n)
	}
	if _, _, ok := tr.lookup(first); ok {
		t.Fatal("the claim moved on: the first message must no longer be current")
	}
	if tr.st.Redelivered(second) {
		t.Fatal("offset 5 is fresh")
	}

	// A copy (as watermill-kafka resends after a nack) is not in the map:
	// it is looked up through its context, which here carries no
	// partition, so it is unknown, as it always was.
	if _, _, ok := tr.lookup(second.Copy()); ok {
		t.Fatal("a copy without a delivery context must not be found")
	}
}

func toRecordHeaders(hs []sarama.RecordHeader) []*sarama.RecordHeader {
	out := make([]*sarama.RecordHeader, len(hs))
	for i := range hs {
		out[i] = &hs[i]
	}
	return out
}

// A message the claims have moved on from is not kept: its payload is
// garbage once everyone else drops it, with many claims sharing the
// tracker's shards.
func TestTrackerKeepsNoPastDelivery(t *testing.T) {
	tr := newPartitionTracker(nil, "g", nil)
	const claims = 48
	for p := range int32(claims) {
		c := newClaimState(context.Background(), -1, nil)
		tr.mu.Lock()
		tr.setClaimLocked(topicPartition{"t", p}, c, nil)
		tr.mu.Unlock()
	}
	u := tr.wrapUnmarshaler(kafka.DefaultMarshaler{})
	deliver := func(p int32, offset int64) *message.Message {
		t.Helper()
		msg, err := u.Unmarshal(&sarama.ConsumerMessage{Topic: "t", Partition: p, Offset: offset, Value: make([]byte, 4<<10)})
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	var freed atomic.Int64
	for p := range int32(claims) {
		msg := deliver(p, 0)
		runtime.AddCleanup(&msg.Payload[0], func(struct{}) { freed.Add(1) }, struct{}{})
	}
	if n := tr.deliveringCount(); n != claims {
		t.Fatalf("tracker holds %d messages, want %d", n, claims)
	}
	next := make([]*message.Message, 0, claims)
	for p := range int32(claims) {
		next = append(next, deliver(p, 1))
	}
	deadline := time.Now().Add(10 * time.Second)
	for freed.Load() < claims && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if got := freed.Load(); got != claims {
		t.Errorf("%d of %d past deliveries still reachable", claims-got, claims)
	}
	for _, msg := range next {
		if _, _, ok := tr.lookup(msg); !ok {
			t.Fatalf("current delivery %p not found", msg)
		}
	}
}

// The claims view finds each live claim by topic and partition, with
// several topics on one partition number, and nothing else.
func TestClaimsView(t *testing.T) {
	tr := newPartitionTracker(nil, "g", nil)
	keys := []topicPartition{{"a", 0}, {"b", 0}, {"a", 7}, {"c", 2}}
	claims := make(map[topicPartition]*claimState)
	for _, k := range keys {
		c := newClaimState(context.Background(), -1, nil)
		claims[k] = c
		tr.mu.Lock()
		tr.setClaimLocked(k, c, nil)
		tr.mu.Unlock()
	}
	for _, k := range keys {
		if got := tr.claimOf(k); got != claims[k] {
			t.Errorf("claimOf(%v) = %p, want %p", k, got, claims[k])
		}
	}
	for _, k := range []topicPartition{{"a", 1}, {"b", 7}, {"a", 8}, {"a", 1 << 30}, {"a", -1}, {"", 0}} {
		if got := tr.claimOf(k); got != nil {
			t.Errorf("claimOf(%v) = %p, want none", k, got)
		}
	}
	tr.mu.Lock()
	tr.setClaimLocked(keys[0], nil, claims[keys[1]]) // not a's claim: kept
	tr.mu.Unlock()
	if tr.claimOf(keys[0]) != claims[keys[0]] {
		t.Fatal("a claim removed by another claim's end")
	}
	tr.mu.Lock()
	tr.setClaimLocked(keys[0], nil, claims[keys[0]])
	tr.mu.Unlock()
	if got := tr.claimOf(keys[0]); got != nil {
		t.Errorf("claimOf(%v) = %p after its claim ended, want none", keys[0], got)
	}
	if got := tr.claimOf(keys[1]); got != claims[keys[1]] {
		t.Errorf("claimOf(%v) = %p after another topic's claim on its partition ended, want %p", keys[1], got, claims[keys[1]])
	}
}

// The failed offsets a key-mode claim inherits are those at or beyond
// its committed offset; the ones below are forgotten, by a claim or a
// commit, so the memory stays within what is not yet committed.
func TestOffsetMemoryFailed(t *testing.T) {
	m := newOffsetMemory()
	k := groupPartition{"g", topicPartition{"t", 0}}
	other := groupPartition{"g", topicPartition{"t", 1}}
	for _, off := range []int64{3, 5, 9} {
		m.fail(k, off)
	}
	m.fail(other, 1)
	if got := m.failedFrom(k, 4); len(got) != 2 || !hasOffset(got, 5) || !hasOffset(got, 9) {
		t.Errorf("failedFrom(4) = %v, want 5 and 9", got)
	}
	if got := m.failedFrom(k, 0); hasOffset(got, 3) {
		t.Errorf("offset 3, below an earlier claim's committed offset, is still remembered: %v", got)
	}
	m.forget(k, 6)
	if got := m.failedFrom(k, 0); len(got) != 1 || !hasOffset(got, 9) {
		t.Errorf("after a commit at 6: %v, want 9", got)
	}
	m.forget(k, 10)
	if got := m.failedFrom(k, 0); got != nil {
		t.Errorf("after a commit at 10: %v, want none", got)
	}
	if got := m.failedFrom(other, 0); len(got) != 1 || !hasOffset(got, 1) {
		t.Errorf("another partition: %v, want 1", got)
	}
}

func hasOffset(set map[int64]struct{}, off int64) bool { _, ok := set[off]; return ok }
