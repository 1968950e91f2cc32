// Package errtext bounds error text that travels in message metadata
// (retry and dead-letter reasons): an error that quotes a payload must not
// make a copy as big as the payload, nor exceed the broker's message size.
package errtext

import (
	"strings"
	"unicode/utf8"
)

// Max is the most bytes Cut keeps.
const Max = 1024

// Cut returns err's text, cut to at most Max bytes on a UTF-8 boundary and
// marked as cut.
func Cut(err error) string {
	s := err.Error()
	if len(s) <= Max {
		return s
	}
	const mark = "… (truncated)"
	cut := Max - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.ToValidUTF8(s[:cut], "") + mark
}
