// Package stackprobe measures how far below a middleware's frame the rest
// of a Watermill handler chain reaches into the message goroutine's stack.
//
// Watermill runs every message on a new goroutine, whose stack starts at
// 2 KiB; a chain that reaches deeper than the room left below Watermill's
// own frame makes the runtime grow the stack by copying it, about 1 µs per
// message (internal/stackroom). A [Probe] placed outermost grows the stack
// to 8 KiB first, so nothing below it moves, fills the region under its
// frame with a pattern, runs the chain, and then finds the lowest byte the
// chain overwrote. Frames the chain allocated but never wrote are not seen,
// so the depth is a lower bound of what the runtime's stack checks see:
// compare depths with each other and with [Room], not to the byte.
//
// Tests only: it reads and writes its goroutine's stack through unsafe
// pointers. Build with the stackprobe tag so that internal/stackroom does
// not grow the stack inside the chain (its 2 KiB frame would be measured).
package stackprobe

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Room is how deep, in bytes, a chain called from Watermill's message
// goroutine can reach before that goroutine's stack has to grow: 2 KiB, less
// the runtime's stack guard (928 bytes on linux/amd64 with Go 1.26), the
// goroutine's start (40 bytes) and Watermill's handleMessage frame (192
// bytes in watermill v1.5.1). Computed, not measured; and since a probe's
// depths are lower bounds, a chain measured a little under Room may still
// grow its stack.
const Room = 2048 - 928 - 40 - 192

const (
	painted  = 6 << 10 // bytes painted below the probe's frame
	skip     = 512     // the probe's own calls stay above this
	pattern  = 0xA7
	growSize = 8 << 10
)

// Probe is a message.HandlerMiddleware that records how deep each message's
// chain reached. Safe for concurrent use.
type Probe struct {
	mu     sync.Mutex
	depths []int
	moved  int
	// paths holds, for each depth measured, what the first message that
	// reached it left on the stack (see Path).
	paths map[int]snapshot
}

// snapshot is a copy of the painted region below a probe's frame, taken
// as the chain returned, and the address the region ended at.
type snapshot struct {
	mem []byte
	top uintptr
}

// Middleware wraps h; place it outermost.
func (p *Probe) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		// Allocated before the stack is grown: an allocation may wait for
		// the collector, which can shrink a stack it finds mostly unused
		// (once a cycle, and a wait can span two), and paint writes
		// painted bytes below mark without looking where the stack ends.
		snap := make([]byte, painted)
		grow()
		var mark byte
		top := uintptr(unsafe.Pointer(&mark))
		paint(unsafe.Pointer(&mark))
		out, err := h(msg)
		// Copied first: any other call could overwrite what the chain left.
		copy(snap, unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(&mark), -painted)), painted))
		d := depth(unsafe.Pointer(&mark))
		moved := uintptr(unsafe.Pointer(&mark)) != top
		p.mu.Lock()
		if moved {
			p.moved++
		} else {
			p.depths = append(p.depths, d)
			if _, ok := p.paths[d]; !ok {
				if p.paths == nil {
					p.paths = make(map[int]snapshot)
				}
				p.paths[d] = snapshot{mem: snap, top: top}
			}
		}
		p.mu.Unlock()
		return out, err
	}
}

// Path returns what the first message measured depth bytes deep left on
// the stack: the return addresses its calls pushed, deepest first, each as
// "offset function:line" with its distance below the probe's frame. A
// frame's return address names the function that made the call. The
// deepest entries are the path to depth; above them, addresses that later,
// shallower calls did not overwrite may be stale. nil if no message
// measured depth.
func (p *Probe) Path(depth int) []string {
	p.mu.Lock()
	sn, ok := p.paths[depth]
	p.mu.Unlock()
	if !ok {
		return nil
	}
	var out []string
	for off := depth; off >= 8; off-- {
		if (sn.top-uintptr(off))%8 != 0 {
			continue // return addresses are word-aligned
		}
		i := painted - off
		pc := uintptr(binary.LittleEndian.Uint64(sn.mem[i : i+8]))
		f := runtime.FuncForPC(pc)
		if f == nil || pc == f.Entry() {
			continue
		}
		_, line := f.FileLine(pc - 1)
		out = append(out, fmt.Sprintf("%d %s:%d", off, f.Name(), line))
	}
	return out
}

// Depths returns the median and the deepest depth recorded, in bytes, and
// how many messages were measured. Messages whose stack moved under the
// probe (the chain outgrew even the grown stack) are not measured; Moved
// counts them.
func (p *Probe) Depths() (median, deepest, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.depths) == 0 {
		return 0, 0, 0
	}
	d := slices.Clone(p.depths)
	slices.Sort(d)
	return d[len(d)/2], d[len(d)-1], len(d)
}

// Moved returns how many messages' stacks moved under the probe.
func (p *Probe) Moved() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.moved
}

// grow makes the goroutine's stack at least growSize, while it is shallow.
//
//go:noinline
func grow() byte {
	var room [growSize]byte
	return touch(&room)
}

//go:noinline
func touch(room *[growSize]byte) byte { return room[growSize-1] }

// paint fills [top-painted, top-skip) with the pattern. That region lies
// below the caller's frame and paint's own, inside the grown stack.
//
//go:noinline
func paint(top unsafe.Pointer) {
	for off := skip; off < painted; off++ {
		*(*byte)(unsafe.Add(top, -off)) = pattern
	}
}

// depth returns the distance from top to the lowest byte no longer holding
// the pattern, or 0 when the chain stayed above the painted region.
//
//go:noinline
func depth(top unsafe.Pointer) int {
	for off := painted - 1; off >= skip; off-- {
		if *(*byte)(unsafe.Add(top, -off)) != pattern {
			return off
		}
	}
	return 0
}

// Moves is a message.HandlerMiddleware that counts the messages whose
// goroutine stack was moved (grown by copying) while the chain below it
// ran. Unlike a [Probe] it leaves the stack as Watermill's message
// goroutine starts it, so it sees what the runtime does; its own frame
// adds a few bytes to the chain's depth. Safe for concurrent use.
type Moves struct {
	n, moved atomic.Int64
}

// Middleware runs h and records whether the stack moved meanwhile.
func (m *Moves) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var mark byte
		top := uintptr(unsafe.Pointer(&mark))
		out, err := h(msg)
		if uintptr(unsafe.Pointer(&mark)) != top {
			m.moved.Add(1)
		}
		m.n.Add(1)
		return out, err
	}
}

// Counts returns how many messages' stacks moved, of how many run.
func (m *Moves) Counts() (moved, n int64) { return m.moved.Load(), m.n.Load() }

// QuietRuntime keeps the garbage collector from changing what stack moves
// measure, until t ends. It collects twice now, while no message goroutine
// holds a deep stack: the runtime sizes new goroutines' stacks by the
// average it found at the last collection (adaptive starting stacks, the
// default since Go 1.19), and an average taken over grown stacks, a control's
// or an earlier test's, would start goroutines large enough not to move.
// Then it turns collection off, so that neither a new average nor a
// collection's assist on a message goroutine (a deep runtime path) comes in
// the middle of the run.
func QuietRuntime(t testing.TB) {
	t.Helper()
	runtime.GC()
	runtime.GC()
	old := debug.SetGCPercent(-1)
	t.Cleanup(func() { debug.SetGCPercent(old) })
}

// Descend calls itself n times, each frame holding 128 bytes of its own:
// a chain that outgrows a new goroutine's stack when n is large enough
// (16 outgrows 2 KiB, 32 outgrows 4 KiB).
//
//go:noinline
func Descend(n int) byte {
	var pad [128]byte
	pad[n%len(pad)] = byte(n)
	if n <= 0 {
		return pad[0]
	}
	return Descend(n-1) + pad[n%len(pad)]
}

// Report reports p's median and deepest depth and Room as b's metrics
// (median-B, deepest-B, room-B) and, with -v, logs the path to the median
// depth. It fails b if no message was measured.
func (p *Probe) Report(b *testing.B) {
	b.Helper()
	median, deepest, n := p.Depths()
	if n == 0 {
		b.Fatalf("no message measured (%d moved under the probe)", p.Moved())
	}
	b.ReportMetric(float64(median), "median-B")
	b.ReportMetric(float64(deepest), "deepest-B")
	b.ReportMetric(Room, "room-B")
	if testing.Verbose() {
		b.Logf("the path to %d bytes, deepest first:\n%s", median, strings.Join(p.Path(median), "\n"))
	}
}
