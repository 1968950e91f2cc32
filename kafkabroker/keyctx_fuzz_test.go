package kafkabroker

import (
	"strings"
	"testing"
)

// Commit metadata comes back from the broker, where any member of the
// group (or anyone allowed to commit its offsets) may have written it:
// decoding never panics, and what it accepts describes only offsets from
// the committed one to maxCompletedSpan past it.
func FuzzDecodeCompleted(f *testing.F) {
	f.Add(int64(100), encodeCompleted(100, []int64{101, 117}))
	f.Add(int64(0), "")
	f.Add(int64(0), completedPrefix+"0:")
	f.Add(int64(-1), completedPrefix+"-1:_w")
	f.Add(int64(9223372036854775807), completedPrefix+"9223372036854775807:AAAA")
	f.Add(int64(5), completedPrefix+"5:AA:AA")
	f.Add(int64(3), completedPrefix+"3:"+strings.Repeat("_", 5000)) // a span longer than any Spillway writes
	f.Fuzz(func(t *testing.T, offset int64, meta string) {
		set, ok := decodeCompleted(offset, meta)
		if !ok {
			if set.bits != nil {
				t.Fatalf("rejected metadata left a set: %+v", set)
			}
			return
		}
		if set.base != offset {
			t.Fatalf("accepted metadata for offset %d describes %d", offset, set.base)
		}
		if len(set.bits) > maxCompletedSpan/8 {
			t.Fatalf("accepted a span of %d bytes, the bound is %d", len(set.bits), maxCompletedSpan/8)
		}
		if offset > -1<<62 && set.has(offset-1) {
			t.Fatal("an offset before the committed one counts as completed")
		}
		if offset < 1<<62 && set.has(offset+maxCompletedSpan) {
			t.Fatal("an offset beyond the span counts as completed")
		}
	})
}

// Whatever records of a window are done, the metadata written for them
// reads back as exactly those records.
func FuzzCompletedRoundTrip(f *testing.F) {
	f.Add(int64(0), []byte{1, 0, 1})
	f.Add(int64(1<<40), []byte{0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add(int64(7), []byte{})
	f.Fuzz(func(t *testing.T, wm int64, done []byte) {
		if wm < 0 || wm > 1<<60 || len(done) > 2*maxCompletedSpan {
			return
		}
		var offs []int64
		for i, b := range done {
			if b&1 == 1 {
				offs = append(offs, wm+int64(i))
			}
		}
		meta := encodeCompleted(wm, offs)
		if len(meta) > 4096 {
			t.Fatalf("metadata of %d bytes, over the brokers' default limit", len(meta))
		}
		set, ok := decodeCompleted(wm, meta)
		for i, b := range done {
			want := b&1 == 1 && i < maxCompletedSpan
			if got := ok && set.has(wm+int64(i)); got != want {
				t.Fatalf("offset %d: completed %v after the round trip, want %v (metadata %q)", wm+int64(i), got, want, meta)
			}
		}
	})
}
