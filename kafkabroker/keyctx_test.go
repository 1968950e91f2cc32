package kafkabroker

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// TestRecordContext: the getters read a key-mode record from withRecord's
// context, and report nothing for a message that did not come from Kafka.
// Partition mode's path (watermill-kafka's own context) is checked where a
// real subscriber delivers: kafkatel's TestAttributes… tests.
func TestRecordContext(t *testing.T) {
	ts := time.Date(2026, 12, 2, 1, 2, 3, 0, time.UTC)
	rec := &sarama.ConsumerMessage{Partition: 7, Offset: 4242, Timestamp: ts, Key: []byte("cell-9")}
	check := func(name string, ctx context.Context) {
		t.Helper()
		if p, ok := PartitionFromCtx(ctx); !ok || p != 7 {
			t.Errorf("%s: partition %d %v", name, p, ok)
		}
		if o, ok := OffsetFromCtx(ctx); !ok || o != 4242 {
			t.Errorf("%s: offset %d %v", name, o, ok)
		}
		if got, ok := TimestampFromCtx(ctx); !ok || !got.Equal(ts) {
			t.Errorf("%s: timestamp %v %v", name, got, ok)
		}
		if k, ok := KeyFromCtx(ctx); !ok || !bytes.Equal(k, []byte("cell-9")) {
			t.Errorf("%s: key %q %v", name, k, ok)
		}
	}
	check("key mode", withRecord(context.Background(), rec))
	check("key mode, delivery context", newDeliveryContext(context.Background(), rec, &keyDelivery{}))

	if _, ok := PartitionFromCtx(context.Background()); ok {
		t.Error("a context without a record reports a partition")
	}
	if _, ok := KeyFromCtx(context.Background()); ok {
		t.Error("a context without a record reports a key")
	}
}

func TestCompletedMetadata(t *testing.T) {
	if m := encodeCompleted(100, nil); m != "" {
		t.Errorf("nothing done beyond the watermark: metadata %q", m)
	}
	meta := encodeCompleted(100, []int64{101, 102, 117, 139})
	if !strings.HasPrefix(meta, completedPrefix+"100:") || len(meta) > 40 {
		t.Errorf("metadata %q", meta)
	}
	set, ok := decodeCompleted(100, meta)
	if !ok {
		t.Fatalf("decode %q failed", meta)
	}
	for off := int64(90); off < 150; off++ {
		want := off == 101 || off == 102 || off == 117 || off == 139
		if set.has(off) != want {
			t.Errorf("offset %d: has %v, want %v", off, set.has(off), want)
		}
	}
	for from, want := range map[int64]string{0: "[101 102 117 139]", 102: "[102 117 139]", 118: "[139]", 140: "[]"} {
		if got := fmt.Sprint(set.from(from)); got != want {
			t.Errorf("from(%d) = %s, want %s", from, got, want)
		}
	}
	for _, bad := range []struct {
		off  int64
		meta string
	}{
		{101, meta},              // committed elsewhere since
		{100, ""},                // none
		{100, "other-app-state"}, // not ours
		{100, completedPrefix + "100"},
		{100, completedPrefix + "x:AA"},
		{100, completedPrefix + "100:%%"},
	} {
		if _, ok := decodeCompleted(bad.off, bad.meta); ok {
			t.Errorf("decodeCompleted(%d, %q) accepted", bad.off, bad.meta)
		}
	}
	// A huge span is cut, never over the brokers' metadata limit.
	m := encodeCompleted(0, []int64{5, 1 << 40})
	if len(m) > 4096 {
		t.Errorf("metadata of %d bytes", len(m))
	}
	set, _ = decodeCompleted(0, m)
	if !set.has(5) || set.has(1<<40) {
		t.Errorf("cut span: has(5) %v has(far) %v", set.has(5), set.has(1<<40))
	}
}

// Lookups of other keys (a tracing span, the router's own) pass through
// the record context on their way to its parent, for every message: that
// pass must not allocate.
func TestRecordContextPassThroughAllocates0(t *testing.T) {
	type otherKey struct{}
	rec := &sarama.ConsumerMessage{Partition: 3, Offset: 42, Key: []byte("k")}
	ctx := withRecord(context.WithValue(context.Background(), otherKey{}, "v"), rec)
	n := testing.AllocsPerRun(100, func() {
		_ = ctx.Value(otherKey{})
		_ = ctx.Value(keyDeliveryKey{})
	})
	if n != 0 {
		t.Fatalf("a lookup through the record context allocates %v times", n)
	}
}
