package kafkatel

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/telemetry"
)

// Attributes returns the Kafka attributes of a message consumed from
// Kafka (either consumer mode of kafkabroker, or watermill-kafka's
// subscriber): messaging.destination.partition.id,
// messaging.kafka.offset and messaging.kafka.message.key (when the message
// has a key), read from the message context. It returns nothing for
// messages from other subscribers. Pass it to telemetry.WithAttributes
// together with telemetry.WithMessagingSystem("kafka").
func Attributes(msg *message.Message) []attribute.KeyValue {
	ctx := msg.Context()
	p, ok := kafkabroker.PartitionFromCtx(ctx)
	if !ok {
		return nil
	}
	attrs := make([]attribute.KeyValue, 0, 3)
	attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(int(p))))
	if off, ok := kafkabroker.OffsetFromCtx(ctx); ok {
		attrs = append(attrs, semconv.MessagingKafkaOffset(int(off)))
	}
	if key, ok := kafkabroker.KeyFromCtx(ctx); ok && len(key) > 0 {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(string(key)))
	}
	return attrs
}

// lagSource is the source [NewLagSource] returns.
type lagSource struct {
	client sarama.Client
	admin  sarama.ClusterAdmin
	group  string
	topics []string
}

// NewLagSource returns a source of group's lag on topics, using client
// (whose Config.Version must be at least 0.10.1, for OffsetFetch v2 and
// ListOffsets v1): for every partition, the high-water mark minus the
// group's committed offset. A partition where the group has committed
// nothing yet counts everything still retained (high-water mark minus the
// oldest offset) as lag.
//
// A client whose Config().Consumer.IsolationLevel is sarama.ReadCommitted
// measures lag as a read-committed consumer sees it: up to the last stable
// offset, and 0 for a partition where only transaction markers and
// aborted records lie past the committed offset (such a consumer never
// receives them, so it never commits past them). Telling the two apart
// costs a fetch of the gap per lagging partition (at most eight of 64 KiB;
// a gap still undecided after them counts in full).
//
// Each Lag call costs one OffsetFetch to the group's coordinator and one
// ListOffsets per partition (two for partitions without a commit); run it
// from a telemetry.LagSampler, never per message. Sarama calls cannot be
// cancelled: the context is checked between requests, and each request is
// bounded by the client's Net timeouts. The source is safe for concurrent
// use and does not close the client.
//
// NewLagSource fails if no topic is given or the cluster controller cannot
// be reached.
func NewLagSource(client sarama.Client, group string, topics ...string) (telemetry.LagSource, error) {
	if client == nil {
		return nil, errors.New("kafkatel: nil client")
	}
	if group == "" || len(topics) == 0 {
		return nil, errors.New("kafkatel: a group and at least one topic are required")
	}
	// The admin shares the client; closing the admin would close it, so
	// the source never does.
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("kafkatel: cluster admin: %w", err)
	}
	src := &lagSource{client: client, admin: admin, group: group, topics: append([]string(nil), topics...)}
	return src.lag, nil
}

// lag returns one sample per partition of every topic.
func (s *lagSource) lag(ctx context.Context) ([]telemetry.LagSample, error) {
	parts := make(map[string][]int32, len(s.topics))
	n := 0
	for _, topic := range s.topics {
		ps, err := s.client.Partitions(topic)
		if err != nil {
			return nil, fmt.Errorf("kafkatel: partitions of %q: %w", topic, err)
		}
		parts[topic] = ps
		n += len(ps)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// Committed offsets first, then high-water marks: read in this order a
	// concurrent commit can only make the lag look larger, never negative.
	committed, err := s.fetchCommitted(parts)
	if err != nil {
		return nil, err
	}

	out := make([]telemetry.LagSample, 0, n)
	for _, topic := range s.topics {
		for _, p := range parts[topic] {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			end, err := s.end(topic, p)
			if err != nil {
				return nil, err
			}
			from, ok := committed[topicPartition{topic, p}]
			if !ok {
				if from, err = s.client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
					return nil, fmt.Errorf("kafkatel: oldest offset of %s/%d: %w", topic, p, err)
				}
			}
			lag := max(end-from, 0)
			if lag > 0 && s.readCommitted() {
				// A read-committed consumer never receives transaction
				// markers nor aborted records, so it never commits past
				// them: a drained partition whose log ends with them keeps
				// its committed offset behind the end. It is drained when
				// nothing it would receive lies in between.
				visible, err := s.visibleBetween(topic, p, from, end)
				if err != nil {
					return nil, err
				}
				if !visible {
					lag = 0
				}
			}
			out = append(out, telemetry.LagSample{Topic: topic, Group: s.group, Partition: p, Lag: lag})
		}
	}
	return out, nil
}

// readCommitted reports whether the client reads as a read-committed
// consumer.
func (s *lagSource) readCommitted() bool {
	c := s.client.Config()
	return c.Consumer.IsolationLevel == sarama.ReadCommitted && c.Version.IsAtLeast(sarama.V0_11_0_0)
}

// end returns the offset a consumer of the client's isolation level reads
// up to: the high-water mark, or under read-committed the last stable
// offset (records of a transaction still open lie beyond it).
func (s *lagSource) end(topic string, p int32) (int64, error) {
	if !s.readCommitted() {
		hwm, err := s.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, fmt.Errorf("kafkatel: high-water mark of %s/%d: %w", topic, p, err)
		}
		return hwm, nil
	}
	res, err := s.admin.ListOffsets(map[string]map[int32]int64{topic: {p: sarama.OffsetNewest}},
		&sarama.ListOffsetsOptions{IsolationLevel: sarama.ReadCommitted})
	if err == nil {
		if r := res[topic][p]; r == nil {
			err = sarama.ErrIncompleteResponse
		} else if err = r.Err; err == nil || errors.Is(err, sarama.ErrNoError) {
			return r.Offset, nil
		}
	}
	return 0, fmt.Errorf("kafkatel: last stable offset of %s/%d: %w", topic, p, err)
}

// scanRounds bounds the fetches visibleBetween makes, scanBytes each: a
// partition still undecided after them counts as lagging. A lagging
// partition usually answers with its first batch; brokers return a first
// batch larger than scanBytes whole.
const (
	scanRounds = 8
	scanBytes  = 64 << 10
)

// visibleBetween reports whether a read-committed consumer positioned at
// from would receive a record below end: one that is neither a
// transaction marker nor part of an aborted transaction. It reads the
// partition from its leader, the way such a consumer does.
func (s *lagSource) visibleBetween(topic string, p int32, from, end int64) (bool, error) {
	broker, err := s.client.Leader(topic, p)
	if err != nil {
		return false, fmt.Errorf("kafkatel: leader of %s/%d: %w", topic, p, err)
	}
	for range scanRounds {
		// Version 5 has the isolation level and the aborted
		// transactions; every broker from 0.11 answers it.
		req := &sarama.FetchRequest{Version: 5, MaxBytes: scanBytes, Isolation: sarama.ReadCommitted}
		req.AddBlock(topic, p, from, scanBytes, -1)
		resp, err := broker.Fetch(req)
		if err != nil {
			return false, fmt.Errorf("kafkatel: reading %s/%d: %w", topic, p, err)
		}
		block := resp.GetBlock(topic, p)
		if block == nil {
			return false, fmt.Errorf("kafkatel: reading %s/%d: %w", topic, p, sarama.ErrIncompleteResponse)
		}
		if !errors.Is(block.Err, sarama.ErrNoError) {
			return false, fmt.Errorf("kafkatel: reading %s/%d: %w", topic, p, block.Err)
		}
		visible, next := firstVisible(block, from, end)
		if visible {
			return true, nil
		}
		switch {
		case next >= end:
			return false, nil // everything below end seen, none of it visible
		case next <= from:
			return true, nil // nothing came back: count the gap as lag
		}
		from = next
	}
	return true, nil
}

// firstVisible reports whether block holds a record at or after from and
// below end that a read-committed consumer receives, and the offset after
// the last batch it holds. Aborted transactions are recognised as Kafka's
// consumers do: a transactional batch of a producer whose aborted
// transaction started at or before it is skipped, until that producer's
// abort marker.
func firstVisible(block *sarama.FetchResponseBlock, from, end int64) (bool, int64) {
	aborted := block.AbortedTransactions
	sort.Slice(aborted, func(i, j int) bool { return aborted[i].FirstOffset < aborted[j].FirstOffset })
	open := make(map[int64]bool)
	next := from
	for _, rs := range block.RecordsSet {
		b := rs.RecordBatch
		if b == nil {
			// The message format before 0.11 has no transactions.
			return true, next
		}
		for len(aborted) > 0 && aborted[0].FirstOffset <= b.LastOffset() {
			open[aborted[0].ProducerID] = true
			aborted = aborted[1:]
		}
		switch {
		case b.Control:
			if abortMarker(b) {
				delete(open, b.ProducerID)
			}
		case b.IsTransactional && open[b.ProducerID]:
		default:
			for _, r := range b.Records {
				if off := b.FirstOffset + r.OffsetDelta; off >= from && off < end {
					return true, next
				}
			}
		}
		next = max(next, b.LastOffset()+1)
	}
	return false, next
}

// abortMarker reports whether control batch b marks an abort: its record's
// key is a version (int16) and a type (int16), 0 for abort, 1 for commit.
func abortMarker(b *sarama.RecordBatch) bool {
	if len(b.Records) == 0 || len(b.Records[0].Key) < 4 {
		return false
	}
	k := b.Records[0].Key
	return k[2] == 0 && k[3] == 0
}

type topicPartition struct {
	topic     string
	partition int32
}

// fetchCommitted returns the committed offset of every partition that has
// one. A coordinator that moved is looked up again once.
func (s *lagSource) fetchCommitted(parts map[string][]int32) (map[topicPartition]int64, error) {
	resp, err := s.admin.ListConsumerGroupOffsets(s.group, parts)
	if errors.Is(err, sarama.ErrGroupIDNotFound) {
		// Sarama returns the broker's answer for a group that has never
		// committed as an error (see below).
		return map[topicPartition]int64{}, nil
	}
	if err == nil && (resp.Err == sarama.ErrNotCoordinatorForConsumer || resp.Err == sarama.ErrConsumerCoordinatorNotAvailable) {
		err = resp.Err
	}
	if err != nil {
		if rerr := s.client.RefreshCoordinator(s.group); rerr != nil {
			return nil, fmt.Errorf("kafkatel: offsets of group %q: %w", s.group, err)
		}
		if resp, err = s.admin.ListConsumerGroupOffsets(s.group, parts); err != nil {
			return nil, fmt.Errorf("kafkatel: offsets of group %q: %w", s.group, err)
		}
	}
	out := make(map[topicPartition]int64)
	switch resp.Err {
	case sarama.ErrNoError:
	case sarama.ErrGroupIDNotFound:
		// Some brokers say so for a group that has never committed; Kafka
		// answers with offset -1 instead. Either way: nothing committed.
		return out, nil
	default:
		return nil, fmt.Errorf("kafkatel: offsets of group %q: %w", s.group, resp.Err)
	}
	for topic, ps := range parts {
		for _, p := range ps {
			b := resp.GetBlock(topic, p)
			if b == nil {
				continue
			}
			if b.Err == sarama.ErrGroupIDNotFound {
				continue
			}
			if b.Err != sarama.ErrNoError {
				return nil, fmt.Errorf("kafkatel: committed offset of %s/%d: %w", topic, p, b.Err)
			}
			if b.Offset >= 0 {
				out[topicPartition{topic, p}] = b.Offset
			}
		}
	}
	return out, nil
}
