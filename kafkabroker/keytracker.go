package kafkabroker

import (
	"cmp"
	"slices"
)

// PartitionWindows calls f with the window of every partition the member
// owns now in consumer key, in topic and partition order: the records
// read and not yet finished, and their bytes (Config.WindowMessages and
// Config.WindowBytes bound them). It calls f for no partition with
// consumer partition, or before the member owns any. [SessionTracker.Window]
// is their sum. f runs after the tracker's lock is released.
func (t *SessionTracker) PartitionWindows(f func(topic string, partition int32, records, bytes int64)) {
	t.eachKeyPartition(func(p *keyPartition) (int64, int64) { return p.w.inWindow() }, f)
}

// PartitionReadAheads is [SessionTracker.PartitionWindows] for the
// read-ahead: the records of each partition read and waiting for room in
// the window, and their bytes. Reading a partition pauses when its
// read-ahead reaches 32 times Config.WindowMessages records or
// Config.WindowBytes bytes.
func (t *SessionTracker) PartitionReadAheads(f func(topic string, partition int32, records, bytes int64)) {
	t.eachKeyPartition(func(p *keyPartition) (int64, int64) { return p.w.readAheadFill() }, f)
}

// eachKeyPartition calls f with read's two numbers for every partition the
// member owns in consumer key, in topic and partition order, after the
// tracker's lock is released.
func (t *SessionTracker) eachKeyPartition(read func(*keyPartition) (int64, int64), f func(topic string, partition int32, records, bytes int64)) {
	type fill struct {
		tp             topicPartition
		records, bytes int64
	}
	t.mu.Lock()
	fills := make([]fill, 0, len(t.keyParts))
	for tp, p := range t.keyParts {
		r, b := read(p)
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
