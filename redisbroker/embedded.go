package redisbroker

import (
	"fmt"
	"sync"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/embedreg"
)

// One in-process server per process, shared by every client created with
// Addr "embedded" and stopped when the last of them is closed.
var embedded struct {
	mu   sync.Mutex
	addr string
	stop func()
	refs int
}

// embeddedLinked reports whether an embedded server is registered (by
// importing package github.com/spillway-go/spillway/embedded).
func embeddedLinked() bool { return embedreg.Redis() != nil }

func acquireEmbedded() (addr string, release func(), err error) {
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	start := embedreg.Redis()
	if start == nil {
		return "", nil, fmt.Errorf("redisbroker: addr %q: %w", spillway.Embedded, spillway.ErrEmbeddedNotLinked)
	}
	if embedded.stop == nil {
		addr, stop, err := start()
		if err != nil {
			return "", nil, fmt.Errorf("redisbroker: starting embedded server: %w", err)
		}
		embedded.addr, embedded.stop = addr, stop
	}
	embedded.refs++
	return embedded.addr, releaseEmbedded, nil
}

func releaseEmbedded() {
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	embedded.refs--
	if embedded.refs == 0 && embedded.stop != nil {
		embedded.stop()
		embedded.stop, embedded.addr = nil, ""
	}
}
