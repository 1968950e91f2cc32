// Package lazyctx provides the lifetime of a per-message context whose
// cancellation is built only when something asks for it.
//
// A context.WithCancel per message registers the child with its parent
// (a map insert under the parent's lock) and unregisters it when the
// message is done. When every message of a subscription derives from the
// same parent, that is a shared lock and map on every message's path, for
// a Done channel most handlers never read. A Life makes the cancellable
// context on first use of Done or AfterFunc (the hook the context package
// uses for contexts derived from it) and otherwise answers Err from its
// parents and its own end. A Context is a Life made a context.Context, to
// embed in a context type of one's own.
package lazyctx

import (
	"context"
	"sync"
	"sync/atomic"
)

// Life is the lifetime of a context: it ends when its parent does, when an
// optional second context (also) does, or when End is called, whichever is
// first. The zero Life is ready to use; a Life must not be copied after
// first use. Its methods are safe for concurrent use. The caller passes the
// same parent and also to every call.
type Life struct {
	mu     sync.Mutex
	inner  atomic.Pointer[context.Context] // built by Context; then authoritative
	cancel context.CancelFunc
	stop   func() bool // also's registration, nil without also
	ended  atomic.Bool
}

// Context returns the cancellable context that stands for the lifetime,
// derived from parent, building it on first use.
func (l *Life) Context(parent, also context.Context) context.Context {
	if c := l.inner.Load(); c != nil {
		return *c
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.inner.Load(); c != nil {
		return *c
	}
	ctx, cancel := context.WithCancel(parent)
	l.cancel = cancel
	if also != nil {
		l.stop = context.AfterFunc(also, cancel)
		if also.Err() != nil {
			cancel() // at once, not on AfterFunc's goroutine
		}
	}
	// Published before ended is read: End either sees the context and
	// cancels it, or has set ended before the load below.
	l.inner.Store(&ctx)
	if l.ended.Load() {
		cancel()
	}
	return ctx
}

// End ends the lifetime. It releases what Context registered with the
// parents, if it was built; it costs an atomic store otherwise.
func (l *Life) End() {
	l.ended.Store(true)
	if l.inner.Load() == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stop != nil {
		l.stop()
	}
	l.cancel()
}

// Err reports why the lifetime ended, nil while it lasts, without building
// the context: parent's error first, then context.Canceled once also has
// ended or End was called.
func (l *Life) Err(parent, also context.Context) error {
	if c := l.inner.Load(); c != nil {
		return (*c).Err()
	}
	if err := parent.Err(); err != nil {
		return err
	}
	if l.ended.Load() || (also != nil && also.Err() != nil) {
		return context.Canceled
	}
	return nil
}

// Context is a context with its parent's values and deadline and a Life
// for its lifetime: it ends when the parent does, when also (if not nil)
// does, or when End is called. Embed it to add values; its methods are
// safe for concurrent use.
type Context struct {
	context.Context // the parent
	also            context.Context
	life            Life
}

// Init makes c a context of parent that also ends with also (nil: only
// with parent and End). Call it once, before c is used; a Context is meant
// to be embedded in a context type of the caller's, allocated with it.
func (c *Context) Init(parent, also context.Context) {
	c.Context, c.also = parent, also
}

// Done returns the channel closed when the lifetime ends, building the
// cancellation on first use.
func (c *Context) Done() <-chan struct{} { return c.lifetime().Done() }

// Err reports why the lifetime ended, without building the cancellation.
func (c *Context) Err() error { return c.life.Err(c.Context, c.also) }

// AfterFunc lets the context package attach a derived context's
// cancellation without starting a goroutine.
func (c *Context) AfterFunc(f func()) func() bool { return context.AfterFunc(c.lifetime(), f) }

// End ends the lifetime; see [Life.End].
func (c *Context) End() { c.life.End() }

func (c *Context) lifetime() context.Context { return c.life.Context(c.Context, c.also) }
