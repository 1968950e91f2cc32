package errtext

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCut(t *testing.T) {
	if got := Cut(errors.New("short")); got != "short" {
		t.Errorf("Cut(short) = %q", got)
	}
	got := Cut(errors.New(strings.Repeat("é", Max)))
	if len(got) > Max || !utf8.ValidString(got) || !strings.HasSuffix(got, "(truncated)") {
		t.Errorf("Cut(long) is %d bytes, valid UTF-8 %v, ends %q", len(got), utf8.ValidString(got), got[max(0, len(got)-20):])
	}
}
