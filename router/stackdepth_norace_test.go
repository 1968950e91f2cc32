//go:build !race

package router

// maxStackUnderHandler bounds TestStackDepthUnderHandler on the memory
// broker. Measured on amd64 with Go 1.26: 1,263 bytes while the gate, the
// budget middleware and the admitted layer did their work inline in their
// closures, 791 since.
const maxStackUnderHandler = 900

// maxStackUnderHandlerRedis is the bound on Redis, whose stack has the
// dead-letter layer too: 1,487 bytes before, 1,023 since the dead-letter
// layer also moves entries in a method of its own.
const maxStackUnderHandlerRedis = 1150
