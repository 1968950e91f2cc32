package redisbroker

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/spillway-go/spillway/internal/errtext"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys the subscriber sets on every message it delivers. A
// producer cannot forge them: values published under these keys are
// replaced (or removed) on delivery.
const (
	// metadataStream is the stream (topic) the entry was read from.
	metadataStream = "_spillway_redis_stream"
	// metadataEntryID is the entry's Redis stream ID, e.g. "1700000000000-0".
	metadataEntryID = "_spillway_redis_id"
	// metadataConsumer is the consumer name the entry is pending for.
	metadataConsumer = "_spillway_redis_consumer"
	// metadataGroup is the consumer group the entry was read by.
	metadataGroup = "_spillway_redis_group"
	// metadataDeliveries is the entry's delivery count in the group, this
	// delivery included: "1" for an entry read for the first time.
	metadataDeliveries = "_spillway_redis_deliveries"
	// metadataExhausted holds, on a message whose entry was delivered more
	// than Config.MaxDeliveries times, why it must go to the dead-letter
	// topic instead of its handler.
	metadataExhausted = "_spillway_redis_exhausted"

	// metadataMalformed is "1" on a message standing for an entry that
	// could not be unmarshalled. Its payload is a JSON [malformedEntry].
	metadataMalformed = "spillway_malformed"
	// metadataMalformedReason holds the unmarshal error of a malformed entry.
	metadataMalformedReason = "spillway_malformed_reason"
)

var reservedMetadata = [...]string{metadataStream, metadataEntryID, metadataConsumer, metadataGroup, metadataDeliveries,
	metadataExhausted, metadataMalformed, metadataMalformedReason}

// entry identifies the Redis stream entry a message was delivered from.
type entry struct {
	Stream, ID, Group, Consumer string
}

// entryOf returns the entry msg was delivered from, and false for a message
// that did not come from a redisbroker Subscriber.
func entryOf(msg *message.Message) (entry, bool) {
	e := entry{
		Stream:   msg.Metadata.Get(metadataStream),
		ID:       msg.Metadata.Get(metadataEntryID),
		Group:    msg.Metadata.Get(metadataGroup),
		Consumer: msg.Metadata.Get(metadataConsumer),
	}
	return e, e.Stream != "" && e.ID != "" && e.Consumer != ""
}

// Deliveries returns how many times the entry msg stands for was
// delivered to its consumer group, this delivery included: Redis's
// delivery count (as XPENDING reports it; 1 for an entry read for the
// first time, more for one claimed from a consumer that died, stalled or
// let it go), plus one for each time this subscriber handed it over again
// after a nack. A consumer presumed stuck takes back the deliveries of
// the entries it read ahead and never handed over, so the count does not
// grow for an entry that only waited behind a stuck one. It is 0 for a
// message that did not come from a [Subscriber].
func Deliveries(msg *message.Message) int {
	n, err := strconv.Atoi(msg.Metadata.Get(metadataDeliveries))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// setDeliveries records on msg that its entry was delivered n times, this
// delivery included, and flags it for the dead-letter topic when n is
// above maxDeliveries (unless that is not positive: unlimited).
func setDeliveries(msg *message.Message, n int64, maxDeliveries int) {
	msg.Metadata.Set(metadataDeliveries, strconv.FormatInt(n, 10))
	if maxDeliveries > 0 && n > int64(maxDeliveries) {
		msg.Metadata.Set(metadataExhausted, fmt.Sprintf("delivered %d times, more than MaxDeliveries (%d)", n, maxDeliveries))
	}
}

// exhausted returns why msg must be dead-lettered because its entry was
// delivered too many times, or "".
func exhausted(msg *message.Message) string { return msg.Metadata.Get(metadataExhausted) }

// IsMalformed reports whether msg stands for an entry that could not be
// unmarshalled. Such a message must not reach a handler: install the
// [DeadLetter] middleware.
func IsMalformed(msg *message.Message) bool { return msg.Metadata.Get(metadataMalformed) == "1" }

// malformedEntry is the payload of a malformed message, a JSON object:
// everything the entry held, so nothing is lost on the way to the
// dead-letter stream. Field values that are valid UTF-8 are in "fields";
// others, base64-encoded, in "fields_base64". docs/redis.md documents it.
type malformedEntry struct {
	Stream       string            `json:"stream"`
	ID           string            `json:"id"`
	Error        string            `json:"error"`
	Fields       map[string]string `json:"fields,omitempty"`
	FieldsBase64 map[string]string `json:"fields_base64,omitempty"`
}

// safeUnmarshaller wraps upstream's unmarshaller. Upstream ends the whole
// subscription when Unmarshal fails; this one never fails: an entry it
// cannot read becomes a message flagged malformed ([IsMalformed]). It also turns
// the entryRef left by entryClient into metadata.
type safeUnmarshaller struct {
	inner         redisstream.Unmarshaller
	group         string
	maxDeliveries int // negative: unlimited
	malformed     *atomic.Uint64
}

func (u safeUnmarshaller) Unmarshal(values map[string]any) (*message.Message, error) {
	ref, _ := values[entryRefKey].(entryRef)
	delete(values, entryRefKey)
	msg, err := u.unmarshalInner(values)
	if err != nil {
		u.malformed.Add(1)
		msg = malformedMessage(ref, values, err)
	} else {
		for _, k := range reservedMetadata {
			delete(msg.Metadata, k)
		}
	}
	if ref.id != "" {
		msg.Metadata.Set(metadataStream, ref.stream)
		msg.Metadata.Set(metadataEntryID, ref.id)
		msg.Metadata.Set(metadataGroup, u.group)
		msg.Metadata.Set(metadataConsumer, ref.consumer)
		if ref.deliveries > 0 {
			setDeliveries(msg, ref.deliveries, u.maxDeliveries)
		}
	}
	return msg, nil
}

func (u safeUnmarshaller) unmarshalInner(values map[string]any) (msg *message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			msg, err = nil, fmt.Errorf("unmarshaller panicked: %v", r)
		}
	}()
	msg, err = u.inner.Unmarshal(values)
	if err == nil && msg == nil {
		err = fmt.Errorf("unmarshaller returned no message")
	}
	if err == nil && msg.Metadata == nil {
		msg.Metadata = make(message.Metadata)
	}
	return msg, err
}

func malformedMessage(ref entryRef, values map[string]any, cause error) *message.Message {
	me := malformedEntry{Stream: ref.stream, ID: ref.id, Error: cause.Error()}
	for k, v := range values {
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		default:
			s = fmt.Sprint(v)
		}
		if utf8.ValidString(s) && utf8.ValidString(k) {
			if me.Fields == nil {
				me.Fields = make(map[string]string, len(values))
			}
			me.Fields[k] = s
		} else {
			if me.FieldsBase64 == nil {
				me.FieldsBase64 = make(map[string]string)
			}
			me.FieldsBase64[strings.ToValidUTF8(k, "\uFFFD")] = base64.StdEncoding.EncodeToString([]byte(s))
		}
	}
	payload, err := json.Marshal(me)
	if err != nil { // cannot happen for strings; keep the error visible anyway
		payload = []byte(`{"error":"encoding the malformed entry failed"}`)
	}
	uuid := "malformed-" + ref.stream + "-" + ref.id
	msg := message.NewMessage(uuid, payload)
	copyTraceContext(msg, values)
	msg.Metadata.Set(metadataMalformed, "1")
	msg.Metadata.Set(metadataMalformedReason, errtext.Cut(cause))
	return msg
}

// traceKeys are the W3C trace-context keys a producer's tracing puts in
// metadata.
var traceKeys = [...]string{"traceparent", "tracestate", "baggage"}

// copyTraceContext copies the producer's W3C trace context from an
// unreadable entry's metadata field, when that field at least can be read
// (upstream's encoding), so the consumer span and the dead-letter copy of
// a malformed entry stay in the producer's trace.
func copyTraceContext(msg *message.Message, values map[string]any) {
	md, ok := values["metadata"]
	if !ok {
		return
	}
	probe, err := (redisstream.DefaultMarshallerUnmarshaller{}).Unmarshal(map[string]any{
		redisstream.UUIDHeaderKey: "probe", "metadata": md,
	})
	if err != nil || probe == nil {
		return
	}
	for _, k := range traceKeys {
		if v := probe.Metadata.Get(k); v != "" && len(v) <= 1024 {
			msg.Metadata.Set(k, v)
		}
	}
}
