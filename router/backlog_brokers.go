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

// How the Kafka backlog is sampled: each partition's backlog (committed
// offset to high-water mark) is cut into kafkaStrata ranges of equal
// message counts, and one fetch of at most kafkaStratumBytes reads the
// head of each. A range read to its end is counted exactly; otherwise the
// vertex_count of the records read, averaged, stands for the range's
// other records. So a partition costs the broker at most kafkaStrata
// fetches and about kafkaStrata × kafkaStratumBytes bytes (a broker
// returns at least one whole record batch, which can be larger) per
// estimate.
const (
	kafkaStrata       = 8
	kafkaStratumBytes = 128 << 10
)

// estimateBacklog reads, per lag sample, the group's committed offset and
// samples the records from there to the high-water mark.
func (b *kafkaBackend) estimateBacklog(ctx context.Context, samples []telemetry.LagSample) ([]vertexEstimate, error) {
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
		if out[i], err = sampleKafkaRange(ctx, client, s.Topic, s.Partition, from, hwm); err != nil {
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
// one partition, stratum by stratum (see kafkaStrata).
func sampleKafkaRange(ctx context.Context, client sarama.Client, topic string, p int32, from, to int64) (vertexEstimate, error) {
	n := to - from
	if n <= 0 {
		return vertexEstimate{}, nil
	}
	strata := min(int64(kafkaStrata), n)
	var est vertexEstimate
	var unknown int64 // messages of strata where no record carried a count
	var sumAll, readAll int64
	for k := range strata {
		if err := ctx.Err(); err != nil {
			return vertexEstimate{}, err
		}
		lo, hi := from+n*k/strata, from+n*(k+1)/strata
		sum, read, counted, err := readKafkaCounts(client, topic, p, lo, hi)
		if err != nil {
			return vertexEstimate{}, err
		}
		est.sampled += read
		sumAll, readAll = sumAll+sum, readAll+counted
		switch size := hi - lo; {
		case counted == 0:
			unknown += size
		case read >= size:
			est.vertices += sum
		default:
			est.vertices += int64(float64(sum) / float64(counted) * float64(size))
		}
	}
	if unknown > 0 && readAll > 0 {
		est.vertices += int64(float64(sumAll) / float64(readAll) * float64(unknown))
	}
	return est, nil
}

// readKafkaCounts fetches at most kafkaStratumBytes from offset lo of one
// partition and returns the vertex_count sum of the records below hi that
// carry one, how many records below hi it read, and how many of those
// carried a count.
func readKafkaCounts(client sarama.Client, topic string, p int32, lo, hi int64) (sum, read, counted int64, err error) {
	leader, err := client.Leader(topic, p)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("kafka: leader of %s/%d: %w", topic, p, err)
	}
	req := &sarama.FetchRequest{Version: 4, MinBytes: 1, MaxBytes: kafkaStratumBytes, Isolation: sarama.ReadUncommitted}
	req.AddBlock(topic, p, lo, kafkaStratumBytes, -1)
	resp, err := leader.Fetch(req)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("kafka: fetch %s/%d at %d: %w", topic, p, lo, err)
	}
	blk := resp.GetBlock(topic, p)
	if blk == nil {
		return 0, 0, 0, fmt.Errorf("kafka: fetch %s/%d at %d: no answer for the partition", topic, p, lo)
	}
	if blk.Err != sarama.ErrNoError {
		return 0, 0, 0, fmt.Errorf("kafka: fetch %s/%d at %d: %w", topic, p, lo, blk.Err)
	}
	for _, rs := range blk.RecordsSet {
		batch := rs.RecordBatch
		if batch == nil || batch.Control {
			continue
		}
		for _, rec := range batch.Records {
			off := batch.FirstOffset + rec.OffsetDelta
			if off < lo || off >= hi {
				continue
			}
			read++
			for _, h := range rec.Headers {
				if string(h.Key) != cost.MetadataKey {
					continue
				}
				if v, src := cost.ParseCount(string(h.Value), len(rec.Value)); src == cost.SourceHeader {
					sum += v
					counted++
				}
				break
			}
		}
	}
	return sum, read, counted, nil
}

// estimateBacklog asks the subscriber of each sample's group to estimate
// its stream's backlog (see redisbroker.Subscriber.BacklogVertices).
func (b *redisBackend) estimateBacklog(ctx context.Context, samples []telemetry.LagSample) ([]vertexEstimate, error) {
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
		v, n, err := sub.BacklogVertices(ctx, s.Topic)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		out[i] = vertexEstimate{vertices: v, sampled: n}
	}
	return out, nil
}
