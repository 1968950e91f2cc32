package kafkabroker

import (
	"context"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
)

// A key-mode tracker answers for its own subscriber's deliveries only: a
// message of another KeySubscriber, or one with no delivery, is unknown to
// it (no session to watch, not a redelivery), and a partition-mode tracker
// knows none of them.
func TestKeyTrackerKnowsOnlyItsDeliveries(t *testing.T) {
	mine := newKeyTracker(nil, "g", nil)
	other := newKeyTracker(nil, "g", nil)
	parts := newPartitionTracker(nil, "g", nil)

	sessDone := make(chan struct{})
	p := &keyPartition{
		h:            &keyHandler{s: &keySubscriber{keys: mine}},
		sessDone:     sessDone,
		failedBefore: map[int64]struct{}{5: {}},
	}
	deliver := func(offset int64) (*message.Message, *keyDelivery) {
		rec := &sarama.ConsumerMessage{Partition: 1, Offset: offset}
		d := &keyDelivery{keyRecord: keyRecord{off: offset}, p: p, rec: rec}
		d.ctx = newDeliveryContext(context.Background(), rec, d)
		msg := message.NewMessage("m", nil)
		msg.SetContext(d.ctx)
		d.msg = msg
		return msg, d
	}
	old, oldD := deliver(5)
	fresh, _ := deliver(4) // below a failed offset, never failed itself
	plain := message.NewMessage("plain", nil)

	if got := mine.st.Revoked(old); got != (<-chan struct{})(sessDone) {
		t.Error("its own delivery: Revoked is not the session's Done channel")
	}
	if !mine.st.Redelivered(old) || mine.st.Redelivered(fresh) {
		t.Error("its own deliveries: offset 5 must be a redelivery, 4 not")
	}
	mine.st.Completed(old)
	if !oldD.completed.Load() {
		t.Error("Completed did not mark its own delivery")
	}
	mine.st.Begin(old)
	if oldD.completed.Load() {
		t.Error("Begin did not start a new attempt of its own delivery")
	}

	for name, tr := range map[string]*SessionTracker{"another key tracker": other.st, "a partition tracker": parts.st} {
		if tr.Revoked(old) != nil || tr.Redelivered(old) {
			t.Errorf("%s knows a delivery of another subscriber", name)
		}
		oldD.completed.Store(false)
		tr.Completed(old)
		if oldD.completed.Load() {
			t.Errorf("%s marked a delivery of another subscriber completed", name)
		}
	}
	if mine.st.Revoked(plain) != nil || mine.st.Redelivered(plain) {
		t.Error("a message with no delivery is known")
	}
}
