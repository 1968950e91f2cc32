package redisbroker

import (
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
)

type fakeUnmarshaller func(map[string]any) (*message.Message, error)

func (f fakeUnmarshaller) Unmarshal(v map[string]any) (*message.Message, error) { return f(v) }

func TestSafeUnmarshallerNeverFails(t *testing.T) {
	ref := entryRef{stream: "s", id: "1-0", consumer: "c"}
	cases := map[string]redisstream.Unmarshaller{
		"error":       fakeUnmarshaller(func(map[string]any) (*message.Message, error) { return nil, errors.New("boom") }),
		"panic":       fakeUnmarshaller(func(map[string]any) (*message.Message, error) { panic("kaboom") }),
		"nil":         fakeUnmarshaller(func(map[string]any) (*message.Message, error) { return nil, nil }),
		"bad msgpack": redisstream.DefaultMarshallerUnmarshaller{},
	}
	for name, inner := range cases {
		t.Run(name, func(t *testing.T) {
			var n atomic.Uint64
			u := safeUnmarshaller{inner: inner, group: "g", malformed: &n}
			values := map[string]any{
				entryRefKey: ref, "_watermill_message_uuid": "u", "metadata": "\xc1", "payload": "p",
			}
			msg, err := u.Unmarshal(values)
			if err != nil || msg == nil {
				t.Fatalf("Unmarshal = %v, %v", msg, err)
			}
			if !IsMalformed(msg) || n.Load() != 1 || msg.Metadata.Get(metadataMalformedReason) == "" {
				t.Fatalf("metadata = %v, count %d", msg.Metadata, n.Load())
			}
			if e, ok := entryOf(msg); !ok || e != (entry{Stream: "s", ID: "1-0", Group: "g", Consumer: "c"}) {
				t.Fatalf("entry = %+v", e)
			}
			var me malformedEntry
			if err := json.Unmarshal(msg.Payload, &me); err != nil {
				t.Fatal(err)
			}
			if me.Fields["payload"] != "p" || me.FieldsBase64["metadata"] != "wQ==" || me.ID != "1-0" {
				t.Fatalf("payload = %+v", me)
			}
			if _, leaked := me.Fields[entryRefKey]; leaked {
				t.Fatal("the internal entry reference leaked into the payload")
			}
		})
	}
}

func TestSafeUnmarshallerStripsReservedMetadata(t *testing.T) {
	var n atomic.Uint64
	u := safeUnmarshaller{inner: fakeUnmarshaller(func(map[string]any) (*message.Message, error) {
		m := message.NewMessage("u", nil)
		m.Metadata = nil // an unmarshaller that leaves metadata nil
		return m, nil
	}), group: "g", malformed: &n}
	msg, err := u.Unmarshal(map[string]any{entryRefKey: entryRef{stream: "s", id: "2-0", consumer: "c"}})
	if err != nil || IsMalformed(msg) || msg.Metadata.Get(metadataEntryID) != "2-0" {
		t.Fatalf("msg = %+v, %v", msg, err)
	}

	var m redisstream.DefaultMarshallerUnmarshaller
	forged := message.NewMessage("f", []byte("x"))
	forged.Metadata.Set(metadataMalformed, "1")
	forged.Metadata.Set(metadataConsumer, "someone-else")
	values, err := m.Marshal("s", forged)
	if err != nil {
		t.Fatal(err)
	}
	strs := map[string]any{}
	for k, v := range values {
		switch v := v.(type) {
		case []byte:
			strs[k] = string(v)
		default:
			strs[k] = v
		}
	}
	u.inner = m
	msg, err = u.Unmarshal(strs) // no entry reference: not from a read
	if err != nil || IsMalformed(msg) || msg.Metadata.Get(metadataConsumer) != "" {
		t.Fatalf("forged metadata survived: %v, %v", msg.Metadata, err)
	}
}
