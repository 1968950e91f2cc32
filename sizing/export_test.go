package sizing

import "time"

// Unexported parts of an AutoBounds, for the tests.

func Windows(b AutoBounds) int               { return b.windows }
func Clamped(b AutoBounds) string            { return b.clamped }
func SlowestCall(b AutoBounds) time.Duration { return b.slowestCall }
