//go:build race

package router

// maxStackUnderHandler is TestStackDepthUnderHandler's bound on the memory
// broker under the race detector, whose instrumentation makes frames
// larger. Measured on amd64 with Go 1.26: 1,960 bytes before the layers
// kept their work out of their closures, 1,184 after, 704 since
// Router.slot.
const maxStackUnderHandler = 850

// maxStackUnderHandlerRedis is the bound on Redis under the race detector:
// 2,048 bytes before, 1,504 after, 1,024 since Router.slot.
const maxStackUnderHandlerRedis = 1200
