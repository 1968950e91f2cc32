package redisbroker

import (
	"errors"
	"fmt"
	"sync"
)

// ErrEmbeddedNotLinked is returned when a Config asks for [EmbeddedAddr]
// but no embedded server is registered: the program must import
// github.com/spillway-go/spillway/embedded for its side effects.
var ErrEmbeddedNotLinked = errors.New(`redisbroker: addr "embedded" needs an embedded server: add import _ "github.com/spillway-go/spillway/embedded"`)

// EmbeddedServer starts an in-process Redis server and returns its address
// and a function that stops it. It is what [RegisterEmbedded] takes.
type EmbeddedServer func() (addr string, stop func(), err error)

// One in-process server per process, shared by every client created with
// Addr "embedded" and stopped when the last of them is closed.
var embedded struct {
	mu    sync.Mutex
	start EmbeddedServer
	addr  string
	stop  func()
	refs  int
}

// RegisterEmbedded makes [EmbeddedAddr] usable by starting servers with
// start. It is called by package github.com/spillway-go/spillway/embedded
// when that package is imported, the way a database/sql driver registers
// itself; the library never links an embedded server on its own. A later
// call replaces the earlier one; it is safe for concurrent use.
func RegisterEmbedded(start EmbeddedServer) {
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	embedded.start = start
}

// EmbeddedLinked reports whether an embedded server is registered.
func EmbeddedLinked() bool {
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	return embedded.start != nil
}

func acquireEmbedded() (addr string, release func(), err error) {
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	if embedded.start == nil {
		return "", nil, ErrEmbeddedNotLinked
	}
	if embedded.stop == nil {
		addr, stop, err := embedded.start()
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
