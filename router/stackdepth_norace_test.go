//go:build !race

package router

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
