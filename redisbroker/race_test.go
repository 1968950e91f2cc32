//go:build race

package redisbroker_test

// raceEnabled reports whether the race detector is on: it slows this
// package's network-heavy tests about fivefold.
const raceEnabled = true
