package kafkabroker

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/spillway-go/spillway/internal/lazyctx"
)

// watermill-kafka puts a consumed record's partition, offset, timestamp and
// key in the message context under keys of an unexported type, readable
// through its exported getters (kafka.MessagePartitionFromCtx and
// siblings) but with no exported setter. A keySubscriber must put them
// under the very same keys, or handlers, telemetry (kafkatel.Attributes)
// and the [SessionTracker] would see nothing. It learns each key by asking
// the getter to read from a context that records the key it is asked for:
// only exported API, no unsafe, no linkname. A test checks that every
// getter reads back what withRecord stores, so an upstream change fails
// the build's tests rather than handlers.

// keyRecorder is a context that remembers the last key asked of it.
type keyRecorder struct {
	context.Context
	key any
}

func (r *keyRecorder) Value(key any) any {
	r.key = key
	return nil
}

func recordKey(read func(context.Context)) any {
	r := &keyRecorder{Context: context.Background()}
	read(r)
	return r.key
}

// recordKeySet is watermill-kafka's message context keys.
type recordKeySet struct{ partition, offset, timestamp, key any }

// theRecordKeys is learned once, at package initialisation.
var theRecordKeys = learnRecordKeys()

// recordKeys returns watermill-kafka's message context keys.
func recordKeys() recordKeySet { return theRecordKeys }

func learnRecordKeys() (k recordKeySet) {
	k.partition = recordKey(func(c context.Context) { _, _ = kafka.MessagePartitionFromCtx(c) })
	k.offset = recordKey(func(c context.Context) { _, _ = kafka.MessagePartitionOffsetFromCtx(c) })
	k.timestamp = recordKey(func(c context.Context) { _, _ = kafka.MessageTimestampFromCtx(c) })
	k.key = recordKey(func(c context.Context) { _, _ = kafka.MessageKeyFromCtx(c) })
	return k
}

// withRecord returns ctx carrying rec's partition, offset, timestamp and
// key as watermill-kafka's subscriber does.
func withRecord(ctx context.Context, rec *sarama.ConsumerMessage) context.Context {
	return &recordContext{Context: ctx, rec: rec}
}

// recordContext is a message's context in key mode: one value that answers
// for the record's partition, offset, timestamp and key (under
// watermill-kafka's keys) and for its delivery, instead of a chain of five
// context.WithValue.
type recordContext struct {
	context.Context
	rec *sarama.ConsumerMessage
	d   *keyDelivery // nil outside a keySubscriber
}

func (c *recordContext) Value(key any) any {
	k := &theRecordKeys
	switch {
	case key == nil:
	case key == k.partition:
		return c.rec.Partition
	case key == k.offset:
		return c.rec.Offset
	case key == k.timestamp:
		return c.rec.Timestamp
	case key == k.key:
		return c.rec.Key
	case key == keyDeliveryKey{} && c.d != nil:
		return c.d
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
