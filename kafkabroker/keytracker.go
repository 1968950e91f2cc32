package kafkabroker

import (
	"cmp"
	"slices"
	"sync"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// keyTracker is the [SessionTracker] of a keySubscriber (consumer key).
// The subscriber keeps each delivery's state itself and puts the delivery
// in its message's context, so a message is found there; the partitions
// register here so that their windows can be reported.
type keyTracker struct {
	st *SessionTracker

	mu    sync.Mutex
	parts map[topicPartition]*keyPartition
}

// newKeyTracker returns the tracker of a keySubscriber in consumer
// group group (see newSessionTracker).
func newKeyTracker(inner kafka.SaramaTracer, group string, seen *offsetMemory) *keyTracker {
	t := &keyTracker{parts: make(map[topicPartition]*keyPartition)}
	t.st = newSessionTracker(inner, group, seen, t)
	return t
}

// delivery returns msg's delivery if msg is one of t's subscriber's
// messages in flight, nil otherwise.
func (t *keyTracker) delivery(msg *message.Message) *keyDelivery {
	if d := deliveryOf(msg); d != nil && d.p.h.s.keys == t {
		return d
	}
	return nil
}

func (t *keyTracker) revoked(msg *message.Message) <-chan struct{} {
	if d := t.delivery(msg); d != nil {
		return d.p.sessDone
	}
	return nil
}

func (t *keyTracker) begin(msg *message.Message) {
	if d := t.delivery(msg); d != nil {
		d.completed.Store(false)
	}
}

func (t *keyTracker) completed(msg *message.Message) {
	if d := t.delivery(msg); d != nil {
		d.completed.Store(true)
	}
}

func (t *keyTracker) redelivered(msg *message.Message) bool {
	if d := t.delivery(msg); d != nil {
		_, failed := d.p.failedBefore[d.off]
		return failed
	}
	return false
}

// consumeClaim leaves the claim to the subscriber's own handler, which
// registers its partition (register).
func (t *keyTracker) consumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim, next sarama.ConsumerGroupHandler) error {
	return next.ConsumeClaim(s, claim)
}

func (t *keyTracker) register(tp topicPartition, p *keyPartition) {
	t.mu.Lock()
	t.parts[tp] = p
	t.mu.Unlock()
}

func (t *keyTracker) unregister(tp topicPartition, p *keyPartition) {
	t.mu.Lock()
	if t.parts[tp] == p {
		delete(t.parts, tp)
	}
	t.mu.Unlock()
}

func (t *keyTracker) owns(tp topicPartition) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.parts[tp] != nil
}

// windows calls f with read's two numbers for every partition the member
// owns, in topic and partition order, after t's lock is released.
func (t *keyTracker) windows(read func(*keyWindow[*keyDelivery]) (int64, int64), f func(topic string, partition int32, records, bytes int64)) {
	type fill struct {
		tp             topicPartition
		records, bytes int64
	}
	t.mu.Lock()
	fills := make([]fill, 0, len(t.parts))
	for tp, p := range t.parts {
		r, b := read(p.w)
		fills = append(fills, fill{tp, r, b})
	}
	t.mu.Unlock()
	slices.SortFunc(fills, func(a, b fill) int {
		return cmp.Or(cmp.Compare(a.tp.topic, b.tp.topic), cmp.Compare(a.tp.partition, b.tp.partition))
	})
	for _, w := range fills {
		f(w.tp.topic, w.tp.partition, w.records, w.bytes)
	}
}
