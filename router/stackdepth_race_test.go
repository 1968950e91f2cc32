//go:build race

package router

// maxStackUnderHandler is TestStackDepthUnderHandler's bound under the race
// detector, whose instrumentation makes frames larger. Measured on amd64
// with Go 1.26: 1,960 bytes before the layers kept their work out of their
// closures, 1,184 since.
const maxStackUnderHandler = 1400
