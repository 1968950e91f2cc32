package kafkabroker

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// committer sends consumer key's commits on a client of its own, so on
// connections the consumer does not fetch on.
//
// A Kafka broker answers the requests of one connection in the order they
// came, and Sarama's offset manager commits on the consumer's connection
// to the coordinator, which is also the connection that fetches when the
// coordinator leads the partitions. A commit sent there waits for the
// fetch ahead of it: up to Consumer.MaxWaitTime when the broker has
// nothing new, and for a full fetch's records otherwise. Key mode waits
// for its commits (the span of records read and not committed is bounded),
// so on one partition that wait, not the work, bounded the throughput
// (TestKeyCommitNotBehindFetch shows the wait; KafkaKeyGoodput in
// cmd/internal/demo, docs/benchmarks.md "Key mode", the throughput).
type committer struct {
	client sarama.Client
	group  string
	conf   *sarama.Config
}

// commit commits offsets (partition to offset, no metadata) of topic in
// sess's generation, and reports the first error: a failed request, or a
// partition the coordinator refused.
func (c *committer) commit(sess sarama.ConsumerGroupSession, topic string, offsets map[int32]int64) error {
	req := c.request(sess)
	ts := int64(0)
	if req.Version == 1 {
		ts = sarama.ReceiveTime
	}
	for p, off := range offsets {
		req.AddBlockWithLeaderEpoch(topic, p, off, -1, ts, "")
	}
	broker, err := c.client.Coordinator(c.group)
	if err != nil {
		return fmt.Errorf("kafkabroker: finding the coordinator of group %s: %w", c.group, err)
	}
	resp, err := broker.CommitOffset(req)
	if err != nil {
		// The connection may be broken: the next commit opens it again.
		_ = broker.Close()
		_ = c.client.RefreshCoordinator(c.group)
		return fmt.Errorf("kafkabroker: committing offsets of group %s: %w", c.group, err)
	}
	for p := range offsets {
		kerr, ok := resp.Errors[topic][p]
		if !ok {
			return fmt.Errorf("kafkabroker: committing offsets of group %s: no answer for %s/%d: %w", c.group, topic, p, sarama.ErrIncompleteResponse)
		}
		if kerr == sarama.ErrNoError {
			continue
		}
		if errors.Is(kerr, sarama.ErrNotCoordinatorForConsumer) || errors.Is(kerr, sarama.ErrConsumerCoordinatorNotAvailable) {
			_ = c.client.RefreshCoordinator(c.group)
		}
		return fmt.Errorf("kafkabroker: committing offsets of group %s, %s/%d: %w", c.group, topic, p, kerr)
	}
	return nil
}

// request is an empty offset commit of sess's generation, in the version
// Sarama's offset manager would send for the configured Kafka version.
func (c *committer) request(sess sarama.ConsumerGroupSession) *sarama.OffsetCommitRequest {
	req := &sarama.OffsetCommitRequest{
		Version:                 1,
		ConsumerGroup:           c.group,
		ConsumerID:              sess.MemberID(),
		ConsumerGroupGeneration: sess.GenerationID(),
	}
	v := c.conf.Version
	switch {
	case v.IsAtLeast(sarama.V2_3_0_0):
		req.Version = 7 // adds the static member's instance id
		if id := c.conf.Consumer.Group.InstanceId; id != "" {
			req.GroupInstanceId = &id
		}
	case v.IsAtLeast(sarama.V2_1_0_0):
		req.Version = 6
	case v.IsAtLeast(sarama.V2_0_0_0):
		req.Version = 4
	case v.IsAtLeast(sarama.V0_11_0_0):
		req.Version = 3
	case v.IsAtLeast(sarama.V0_9_0_0):
		req.Version = 2
	}
	if req.Version >= 2 && req.Version <= 4 {
		// Versions 2 to 4 carry the retention; -1 is the broker's.
		req.RetentionTime = -1
		if r := c.conf.Consumer.Offsets.Retention; r > 0 {
			req.RetentionTime = int64(r / time.Millisecond)
		}
	}
	return req
}
