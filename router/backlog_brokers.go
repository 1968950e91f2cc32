package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/telemetry"
)

// How the Kafka backlog is sampled. A first fetch at the committed offset
// measures the average record size, which tells roughly how many records
// kafkaPartitionBytes buys. The backlog is cut into up to kafkaStrata
// ranges of equal message counts, and rounds read the same number of
// further records at the start of every range (spread order) until the
// budget is spent: the records read do not depend on their sizes, so a
// range's average stands for the range without favouring large or small
// records. A round is cut short once twice the budget is spent. A range
// read to its end is exact; one not read at all takes its nearest read
// neighbour's average.
const (
	kafkaStrata         = 256
	kafkaPartitionBytes = 1 << 20
	kafkaProbeBytes     = 64 << 10
)

// estimateBacklog reads, per lag sample, the group's committed offset and
// samples the records from there to the high-water mark.
func (b *kafkaBackend) estimateBacklog(ctx context.Context, samples []telemetry.LagSample, unstamped int64) ([]vertexEstimate, error) {
	client, err := b.cluster.Client()
	if err != nil {
		return nil, kafkaError(err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("kafka: cluster admin: %w", err)
	}
	// The admin shares the cluster's client: closing it would close the
	// client, so it is left to the garbage collector.
	type groupTopic struct{ group, topic string }
	parts := make(map[groupTopic][]int32)
	for _, s := range samples {
		if s.Lag > 0 {
			k := groupTopic{s.Group, s.Topic}
			parts[k] = append(parts[k], s.Partition)
		}
	}
	committed := make(map[groupTopic]*sarama.OffsetFetchResponse, len(parts))
	for k, ps := range parts {
		resp, err := admin.ListConsumerGroupOffsets(k.group, map[string][]int32{k.topic: ps})
		if err != nil && !errors.Is(err, sarama.ErrGroupIDNotFound) {
			return nil, fmt.Errorf("kafka: offsets of group %q: %w", k.group, err)
		}
		committed[k] = resp
	}
	out := make([]vertexEstimate, len(samples))
	for i, s := range samples {
		if s.Lag <= 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hwm, err := client.GetOffset(s.Topic, s.Partition, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("kafka: high-water mark of %s/%d: %w", s.Topic, s.Partition, err)
		}
		from := int64(-1)
		if resp := committed[groupTopic{s.Group, s.Topic}]; resp != nil {
			if blk := resp.GetBlock(s.Topic, s.Partition); blk != nil && blk.Err == sarama.ErrNoError {
				from = blk.Offset
			}
		}
		if from < 0 {
			if from, err = client.GetOffset(s.Topic, s.Partition, sarama.OffsetOldest); err != nil {
				return nil, fmt.Errorf("kafka: oldest offset of %s/%d: %w", s.Topic, s.Partition, err)
			}
		}
		if out[i], err = sampleKafkaRange(ctx, client, s.Topic, s.Partition, from, hwm, unstamped); err != nil {
			return nil, err
		}
		out[i] = scaleEstimate(out[i], hwm-from, s.Lag)
	}
	return out, nil
}

// scaleEstimate scales e, an estimate over n messages, to lag messages
// (the lag sample and the range read can be a few messages apart when the
// group commits or producers publish between the two reads).
func scaleEstimate(e vertexEstimate, n, lag int64) vertexEstimate {
	if n <= 0 || n == lag {
		return e
	}
	e.vertices = int64(float64(e.vertices) * float64(lag) / float64(n))
	e.sampled = min(e.sampled, lag)
	return e
}

// sampleKafkaRange estimates the vertices of the records [from, to) of
// one partition (see kafkaStrata), a record without a valid vertex_count
// at unstamped vertices.
func sampleKafkaRange(ctx context.Context, client sarama.Client, topic string, p int32, from, to, unstamped int64) (vertexEstimate, error) {
	n := to - from
	if n <= 0 {
		return vertexEstimate{}, nil
	}
	probe := kafkaStratum{lo: from, next: from, hi: to}
	probeBytes, err := probe.fetch(client, topic, p, kafkaProbeBytes, unstamped)
	if err != nil || probe.read == 0 {
		return vertexEstimate{}, err
	}
	recordBytes := probeBytes/probe.read + 1 // the probe's average
	affordable := max(int64(kafkaPartitionBytes)/recordBytes, 1)
	k := min(int64(kafkaStrata), affordable, n)
	// A round reads per records of every range: at most a quarter of a
	// range, so that heavy ranges cannot take the whole budget in one
	// round while others go unread.
	per := max(min(affordable/k, (n/k+3)/4), 1)
	strata := make([]kafkaStratum, k)
	for i := range strata {
		lo, hi := from+n*int64(i)/k, from+n*int64(i+1)/k
		strata[i] = kafkaStratum{lo: lo, next: lo, hi: min(lo+per, hi), size: hi - lo}
	}
	// Rounds of per more records at the start of every range, while the
	// budget lasts.
	spent, order := int64(0), spreadOrder(int(k))
	for round := 0; spent < kafkaPartitionBytes; round++ {
		if round > 0 {
			grew := false
			for i := range strata {
				if hi := min(strata[i].hi+per, strata[i].lo+strata[i].size); hi > strata[i].hi && strata[i].next >= strata[i].hi && !strata[i].stopped {
					strata[i].hi, grew = hi, true
				}
			}
			if !grew {
				break
			}
		}
		for _, i := range order {
			st := &strata[i]
			for st.next < st.hi && spent < 2*kafkaPartitionBytes {
				if err := ctx.Err(); err != nil {
					return vertexEstimate{}, err
				}
				// Ask for about what the records wanted take at the
				// probe's average size; a larger record still comes,
				// alone.
				want := (st.hi - st.next) * 2 * recordBytes
				used, err := st.fetch(client, topic, p, int32(min(want, kafkaPartitionBytes, 2*kafkaPartitionBytes-spent)), unstamped)
				if err != nil {
					return vertexEstimate{}, err
				}
				spent += used
			}
		}
	}
	// A range stands for itself: read to its end it is exact, otherwise
	// the records read (the same number at the start of every range, so
	// chosen without regard to their sizes) give its average. A range not
	// read takes its nearest read neighbour's average.
	var est vertexEstimate
	for i := range strata {
		est.sampled += strata[i].read
		src := nearestStratum(strata, i, func(st kafkaStratum) bool { return st.read > 0 })
		if src < 0 {
			continue
		}
		s := strata[src]
		est.vertices += int64(float64(s.sum) / float64(s.read) * float64(strata[i].size))
	}
	return est, nil
}

// nearestStratum returns the index of the range closest to i for which
// ok holds, or -1.
func nearestStratum(strata []kafkaStratum, i int, ok func(kafkaStratum) bool) int {
	for d := range len(strata) {
		if i-d >= 0 && ok(strata[i-d]) {
			return i - d
		}
		if i+d < len(strata) && ok(strata[i+d]) {
			return i + d
		}
	}
	return -1
}

// spreadOrder returns 0..k-1 in an order that spreads the first ones over
// the whole range (bit-reversed), so that reading stopped early still
// sampled the whole backlog.
func spreadOrder(k int) []int {
	bits := 0
	for 1<<bits < k {
		bits++
	}
	out := make([]int, 0, k)
	for i := range 1 << bits {
		r := 0
		for b := range bits {
			if i&(1<<b) != 0 {
				r |= 1 << (bits - 1 - b)
			}
		}
		if r < k {
			out = append(out, r)
		}
	}
	return out
}

// kafkaStratum is one range of a partition's backlog, size records from
// lo, of which [lo, hi) are to be read, and what was read of it: the
// records up to next, how many, and the sum of their counts (an unstamped
// record's at its charge).
type kafkaStratum struct {
	lo, next, hi, size int64
	read, sum          int64
	stopped            bool // a fetch brought nothing below hi
}

// fetch reads at most maxBytes from st.next (at least one record batch)
// and adds the records below st.hi, a record without a valid vertex_count
// at unstamped vertices. It returns the bytes the records took.
func (st *kafkaStratum) fetch(client sarama.Client, topic string, p int32, maxBytes int32, unstamped int64) (used int64, err error) {
	leader, err := client.Leader(topic, p)
	if err != nil {
		return 0, fmt.Errorf("kafka: leader of %s/%d: %w", topic, p, err)
	}
	req := &sarama.FetchRequest{Version: 4, MinBytes: 1, MaxBytes: maxBytes, Isolation: sarama.ReadUncommitted}
	req.AddBlock(topic, p, st.next, maxBytes, -1)
	resp, err := leader.Fetch(req)
	if err != nil {
		return 0, fmt.Errorf("kafka: fetch %s/%d at %d: %w", topic, p, st.next, err)
	}
	blk := resp.GetBlock(topic, p)
	if blk == nil {
		return 0, fmt.Errorf("kafka: fetch %s/%d at %d: no answer for the partition", topic, p, st.next)
	}
	if blk.Err != sarama.ErrNoError {
		return 0, fmt.Errorf("kafka: fetch %s/%d at %d: %w", topic, p, st.next, blk.Err)
	}
	progressed := false
	for _, rs := range blk.RecordsSet {
		batch := rs.RecordBatch
		if batch == nil {
			continue
		}
		for _, rec := range batch.Records {
			off := batch.FirstOffset + rec.OffsetDelta
			if off < st.next || off >= st.hi {
				continue
			}
			st.next, progressed = off+1, true
			if batch.Control {
				continue
			}
			st.read++
			used += int64(len(rec.Key) + len(rec.Value))
			count := ""
			for _, h := range rec.Headers {
				used += int64(len(h.Key) + len(h.Value))
				if string(h.Key) == cost.MetadataKey {
					count = string(h.Value)
				}
			}
			if v, src := cost.ParseCount(count, len(rec.Value)); src == cost.SourceHeader {
				st.sum += v
			} else {
				st.sum += unstamped
			}
		}
	}
	if !progressed {
		// Nothing below hi came back (a gap of compacted or aborted
		// records, or the range was deleted): stop reading this range.
		st.hi, st.stopped = st.next, true
	}
	return used, nil
}

// estimateBacklog asks the subscriber of each sample's group to estimate
// its stream's backlog (see redisbroker.Subscriber.BacklogVertices).
func (b *redisBackend) estimateBacklog(ctx context.Context, samples []telemetry.LagSample, unstamped int64) ([]vertexEstimate, error) {
	out := make([]vertexEstimate, len(samples))
	for i, s := range samples {
		if s.Lag <= 0 {
			continue
		}
		b.mu.Lock()
		var sub *redisbroker.Subscriber
		for _, x := range b.subs {
			if x.Config().ConsumerGroup == s.Group {
				sub = x
				break
			}
		}
		b.mu.Unlock()
		if sub == nil {
			continue // closed since the lag was read
		}
		v, n, err := sub.BacklogVertices(ctx, s.Topic, unstamped)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		out[i] = vertexEstimate{vertices: v, sampled: n}
	}
	return out, nil
}
