package retrygate

import (
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// FuzzReadCount: an attempt or deferral count read from metadata, which
// a producer or a forged header sets, is never negative and never above
// maxAttemptCount; a missing or unreadable value counts as 0, and a plain
// count in range is read as it is.
func FuzzReadCount(f *testing.F) {
	for _, s := range []string{"", "0", "3", "-1", "+2", "007", " 1", "1e3", "99999999999999999999", strconv.Itoa(maxAttemptCount + 1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		msg := message.NewMessage("m", nil)
		if v != "" {
			msg.Metadata.Set(attemptKey, v)
		}
		got := readCount(msg, attemptKey)
		if got < 0 || got > maxAttemptCount {
			t.Fatalf("readCount(%q) = %d, outside [0, %d]", v, got, maxAttemptCount)
		}
		want := 0
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			want = min(n, maxAttemptCount)
		}
		if got != want {
			t.Fatalf("readCount(%q) = %d, want %d", v, got, want)
		}
	})
}
