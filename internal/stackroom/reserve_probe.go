//go:build stackprobe

package stackroom

// Reserve does nothing in a stackprobe build.
func Reserve() {}

// ReserveDeep does nothing in a stackprobe build.
func ReserveDeep() {}
