package redisbroker

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/spillway-go/spillway/internal/errtext"
)

// The unmarshal error of a malformed entry is kept in metadata cut to about
// 1 KiB, on a rune boundary, however long the error (issue 13, item 11).
func TestEdgeMalformedReasonBounded(t *testing.T) {
	long := errors.New("cannot decode: " + strings.Repeat("é", 1<<20))
	msg := malformedMessage(entryRef{stream: "s", id: "1-0", consumer: "c"}, map[string]any{"payload": "x"}, long)
	got := msg.Metadata.Get(metadataMalformedReason)
	if len(got) > errtext.Max || !utf8.ValidString(got) || !strings.HasSuffix(got, "(truncated)") {
		t.Errorf("reason is %d bytes (valid UTF-8 %v), want ≤ %d and marked", len(got), utf8.ValidString(got), errtext.Max)
	}
	short := malformedMessage(entryRef{stream: "s", id: "1-0", consumer: "c"}, nil, errors.New("bad"))
	if r := short.Metadata.Get(metadataMalformedReason); r != "bad" {
		t.Errorf("short reason = %q", r)
	}
}
