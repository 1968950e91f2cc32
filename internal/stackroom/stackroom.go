// Package stackroom grows a goroutine's stack before a deep call chain
// needs it, while the stack is still shallow.
//
// Watermill runs every message on a goroutine of its own, which starts with
// the runtime's smallest stack (2 KiB). Spillway's middleware stack is deep
// enough that such a goroutine always outgrows it somewhere inside, and Go
// grows a stack by copying it and adjusting every frame on it: the deeper
// the chain at that point, the dearer the copy (measured at 2–3 µs per
// message on the Kafka benchmark, most of the stack's own CPU). Calling
// [Reserve] at the top of the chain makes the runtime grow the stack once,
// while only two or three frames are on it; the layers below then run
// without growing it again.
//
// A caller that cannot know how deep the chain below it reaches (a
// middleware in a stack the application composes) asks a [Gauge], which
// learns from a sample of calls run without growing first whether the
// chain outgrows the stack at all.
//
// Built with the stackprobe tag, Reserve and ReserveDeep do nothing, so
// that internal/stackprobe measures how deep the layers reach on their own
// (the router's BenchmarkStackHighWater).
package stackroom
