//go:build !stackprobe

package stackroom

// frame is Reserve's frame size: enough that a 2 KiB stack, with the
// caller's few frames on it, grows to 4 KiB at once, which holds the whole
// middleware stack with an empty handler (a handler that needs more grows it
// further itself, as it would without Spillway). A goroutine whose stack is
// already large enough pays only for clearing the frame.
const frame = 2 << 10

// Reserve makes sure the calling goroutine's stack has about 2 KiB free
// below the caller's frame, growing it now if it has not.
//
//go:noinline
func Reserve() {
	var room [frame]byte
	use(&room)
}

// use is opaque to the compiler (not inlined), so Reserve's frame must
// really hold room.
//
//go:noinline
func use(room *[frame]byte) byte { return room[frame-1] }

// deepFrame is ReserveDeep's frame size: a 2 KiB stack grows to 8 KiB at
// once, in one copy.
const deepFrame = 4 << 10

// ReserveDeep is [Reserve] for chains that need more than 4 KiB: those that
// start a span with OpenTelemetry's SDK, whose sampler and span setup sit
// deep below the middleware (measured: with 4 KiB the stack grew a second
// time there, inside the sampler, for every message). It makes sure about
// 4 KiB are free below the caller's frame.
//
//go:noinline
func ReserveDeep() {
	var room [deepFrame]byte
	useDeep(&room)
}

//go:noinline
func useDeep(room *[deepFrame]byte) byte { return room[deepFrame-1] }
