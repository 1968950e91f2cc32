package kafkabroker

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/spillway-go/spillway/internal/lazyctx"
)

// recordKey is the context key of a key-mode message's record. Partition
// mode's records are in the context under watermill-kafka's own keys,
// which only its getters read; the getters below read either.
type recordKey struct{}

// PartitionFromCtx returns the partition of the record a message was
// consumed from, in either consumer mode: [ConsumerKey]'s subscriber puts
// the record in the context under a key of its own, watermill-kafka's
// subscriber ([ConsumerPartition]) under its own keys, read here through
// kafka.MessagePartitionFromCtx. ok is false for a message that was not
// consumed from Kafka. Handlers that must work in key mode read the record
// with this function and its siblings rather than watermill-kafka's
// getters, which see only watermill-kafka's subscriber.
func PartitionFromCtx(ctx context.Context) (partition int32, ok bool) {
	if rec, ok := ctx.Value(recordKey{}).(*sarama.ConsumerMessage); ok {
		return rec.Partition, true
	}
	return kafka.MessagePartitionFromCtx(ctx)
}

// OffsetFromCtx returns the offset of the record a message was consumed
// from, in either consumer mode (see [PartitionFromCtx]).
func OffsetFromCtx(ctx context.Context) (offset int64, ok bool) {
	if rec, ok := ctx.Value(recordKey{}).(*sarama.ConsumerMessage); ok {
		return rec.Offset, true
	}
	return kafka.MessagePartitionOffsetFromCtx(ctx)
}

// TimestampFromCtx returns the timestamp of the record a message was
// consumed from, in either consumer mode (see [PartitionFromCtx]).
func TimestampFromCtx(ctx context.Context) (ts time.Time, ok bool) {
	if rec, ok := ctx.Value(recordKey{}).(*sarama.ConsumerMessage); ok {
		return rec.Timestamp, true
	}
	return kafka.MessageTimestampFromCtx(ctx)
}

// KeyFromCtx returns the Kafka key of the record a message was consumed
// from, in either consumer mode (see [PartitionFromCtx]); nil when the
// record had none.
func KeyFromCtx(ctx context.Context) (key []byte, ok bool) {
	if rec, ok := ctx.Value(recordKey{}).(*sarama.ConsumerMessage); ok {
		return rec.Key, true
	}
	return kafka.MessageKeyFromCtx(ctx)
}

// withRecord returns ctx carrying rec for the getters above.
func withRecord(ctx context.Context, rec *sarama.ConsumerMessage) context.Context {
	return &recordContext{Context: ctx, rec: rec}
}

// recordContext is a message's context in key mode: one value that answers
// for the record and for its delivery, instead of a chain of
// context.WithValue.
type recordContext struct {
	context.Context
	rec *sarama.ConsumerMessage
	d   *keyDelivery // nil outside a keySubscriber
}

func (c *recordContext) Value(key any) any {
	switch key {
	case recordKey{}:
		return c.rec
	case keyDeliveryKey{}:
		if c.d != nil {
			return c.d
		}
	}
	return c.Context.Value(key)
}

// deliveryContext is a key-mode message's context: the record's values
// (rc) and a lifetime that ends with the subscription's context, or once
// the delivery settles (End), as Watermill expects of a message context
// after its ack. Its cancellation is built lazily (internal/lazyctx): a
// handler that never asks for Done costs no cancellable context registered
// with the subscription's, whose lock and map every partition's deliveries
// would otherwise share.
type deliveryContext struct {
	lazyctx.Context // of &rc
	rc              recordContext
}

// newDeliveryContext returns the context of d, a delivery of rec in the
// subscription whose context is sub: one allocation.
func newDeliveryContext(sub context.Context, rec *sarama.ConsumerMessage, d *keyDelivery) *deliveryContext {
	c := &deliveryContext{rc: recordContext{Context: sub, rec: rec, d: d}}
	c.Init(&c.rc, nil)
	return c
}

// completedSet is the records an earlier owner completed beyond its
// committed watermark, read from the commit's metadata.
type completedSet struct {
	base int64 // the watermark: bit i is offset base+i
	bits []byte
}

func (s completedSet) has(offset int64) bool {
	i := offset - s.base
	if i < 0 || i >= int64(len(s.bits))*8 {
		return false
	}
	return s.bits[i/8]&(1<<(i%8)) != 0
}

// from returns the offsets in s at or beyond offset, in order.
func (s completedSet) from(offset int64) []int64 {
	var out []int64
	for i := max(0, offset-s.base); i < int64(len(s.bits))*8; i++ {
		if s.bits[i/8]&(1<<(i%8)) != 0 {
			out = append(out, s.base+i)
		}
	}
	return out
}

// completedPrefix marks Spillway's commit metadata (format version 1):
// "spw1:<watermark>:<bitset, base64 URL without padding>".
const completedPrefix = "spw1:"

// maxCompletedSpan bounds the offsets the metadata describes, so it stays
// well under brokers' offset.metadata.max.bytes (4096 by default).
const maxCompletedSpan = 3000 * 8

// encodeCompleted describes done, the offsets of records completed beyond
// the watermark wm (in order, all after wm), as commit metadata, "" when
// there are none. Offsets past maxCompletedSpan are left out: those
// records are processed again.
func encodeCompleted(wm int64, done []int64) string {
	var last int64 = -1
	for _, off := range done {
		if off-wm < maxCompletedSpan {
			last = off
		}
	}
	if last < wm {
		return ""
	}
	bits := make([]byte, (last-wm)/8+1)
	for _, off := range done {
		if i := off - wm; i >= 0 && i < maxCompletedSpan {
			bits[i/8] |= 1 << (i % 8)
		}
	}
	return completedPrefix + strconv.FormatInt(wm, 10) + ":" + base64.RawURLEncoding.EncodeToString(bits)
}

// decodeCompleted reads metadata committed with offset; ok is false when
// it is not Spillway's or describes another offset.
func decodeCompleted(offset int64, meta string) (completedSet, bool) {
	rest, ok := strings.CutPrefix(meta, completedPrefix)
	if !ok {
		return completedSet{}, false
	}
	base, enc, ok := strings.Cut(rest, ":")
	if !ok {
		return completedSet{}, false
	}
	wm, err := strconv.ParseInt(base, 10, 64)
	if err != nil || wm != offset {
		return completedSet{}, false
	}
	// Spillway never writes a longer span; a longer one was written by
	// something else and skips nothing.
	if base64.RawURLEncoding.DecodedLen(len(enc)) > maxCompletedSpan/8 {
		return completedSet{}, false
	}
	bits, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return completedSet{}, false
	}
	return completedSet{base: wm, bits: bits}, true
}
