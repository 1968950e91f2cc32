//go:build !race

package router

import "github.com/spillway-go/spillway/internal/stackprobe"

// maxStackUnderHandler bounds TestStackDepthUnderHandler on the memory
// broker. Measured on amd64 with Go 1.26: 1,263 bytes while the gate, the
// budget middleware and the admitted layer did their work inline in their
// closures, 791 once they did it in helpers, 447 since they are one
// middleware (Router.slot).
const maxStackUnderHandler = 550

// maxStackUnderHandlerRedis is the bound on Redis, whose stack has the
// dead-letter layer too: 1,487 bytes before, 1,023 once the dead-letter
// layer also moved entries in a method of its own, 679 since Router.slot.
const maxStackUnderHandlerRedis = 800

// maxLeanDepth bounds TestLeanStackFitsStartingStack's probe: the room a
// new goroutine's stack leaves the middleware stack. The probe sees only
// the bytes the chain wrote, so the test also checks what the bound stands
// for, that the stack does not move. Measured on amd64 with Go 1.26: 727
// bytes on the memory broker and on Kafka's partition mode without
// telemetry, 839 on both with it (with 0 to 9 of 200 messages moving the
// stack: rare paths); 863 on Kafka moved it for every message.
const maxLeanDepth = stackprobe.Room

// checkMoves: TestLeanStackFitsStartingStack checks that the stack does not
// move, which it does with the race detector's frames.
const checkMoves = true
