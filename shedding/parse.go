package shedding

import "strconv"

// field is the state of one metadata value.
type field uint8

const (
	fieldOK        field = iota
	fieldMissing         // absent or empty
	fieldMalformed       // present but unusable
)

// parsePriority reads a region priority: a base-10 integer with an optional
// leading sign and nothing else (no spaces, no underscores, no fraction),
// in the range of int64.
func parsePriority(s string) (int64, field) {
	if s == "" {
		return 0, fieldMissing
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fieldMalformed
	}
	return n, fieldOK
}

// parseVersion reads an entity version: unsigned base-10 digits and nothing
// else (no sign, no spaces), in the range of uint64.
func parseVersion(s string) (uint64, field) {
	if s == "" {
		return 0, fieldMissing
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fieldMalformed
	}
	return n, fieldOK
}
