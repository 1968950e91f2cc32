//go:build !race

package router

// maxStackUnderHandler bounds TestStackDepthUnderHandler. Measured on amd64
// with Go 1.26: 1,263 bytes while the gate, the budget middleware and the
// admitted layer did their work inline in their closures, 791 since.
const maxStackUnderHandler = 900
