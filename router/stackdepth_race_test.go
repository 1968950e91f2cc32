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

// maxLeanDepth is TestLeanStackFitsStartingStack's bound under the race
// detector, whose frames do not fit in a new goroutine's stack anyway (the
// router still leaves it ungrown: a race build is for finding races, not
// for speed): 1,127 bytes on the memory broker and on Kafka's partition
// mode without telemetry, 1,319 with it, measured on amd64 with Go 1.26;
// on Redis 1,223 without and 1,415 with, up to 1,551 on a loaded machine
// (the median message then takes a contended lock's slow path). It still
// catches the growth coming back: the probe would see its 2 KiB frame
// (the control measures 2,599).
const maxLeanDepth = 1700

// checkMoves: the race detector's frames outgrow a new goroutine's stack,
// so TestLeanStackFitsStartingStack does not check that it stays put.
const checkMoves = false
