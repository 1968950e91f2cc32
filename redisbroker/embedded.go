package redisbroker

import (
	"fmt"
	"sync"

	"github.com/alicebob/miniredis/v2"
)

// One in-process miniredis per process, shared by every client created with
// Addr "embedded" and stopped when the last of them is closed.
var embedded struct {
	mu   sync.Mutex
	srv  *miniredis.Miniredis
	refs int
}

func acquireEmbedded() (addr string, release func(), err error) {
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	if embedded.srv == nil {
		srv := miniredis.NewMiniRedis()
		if err := srv.Start(); err != nil {
			return "", nil, fmt.Errorf("redisbroker: starting embedded miniredis: %w", err)
		}
		embedded.srv = srv
	}
	embedded.refs++
	return embedded.srv.Addr(), releaseEmbedded, nil
}

func releaseEmbedded() {
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	embedded.refs--
	if embedded.refs == 0 && embedded.srv != nil {
		embedded.srv.Close()
		embedded.srv = nil
	}
}
