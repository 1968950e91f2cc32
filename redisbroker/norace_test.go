//go:build !race

package redisbroker_test

const raceEnabled = false
