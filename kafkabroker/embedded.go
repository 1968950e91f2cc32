package kafkabroker

import (
	"errors"
	"fmt"
	"sync"
)

// Embedded is the broker list entry that asks for an in-process broker
// instead of a cluster.
const Embedded = "embedded"

// ErrEmbeddedNotLinked is returned when the configuration asks for the
// [Embedded] broker but none is registered: the program must import
// github.com/spillway-go/spillway/embedded for its side effects.
var ErrEmbeddedNotLinked = errors.New(`kafkabroker: brokers [embedded] needs an embedded broker: add import _ "github.com/spillway-go/spillway/embedded"`)

// EmbeddedCluster starts an in-process Kafka broker whose topics have
// partitions partitions (topics are created up front; others are created
// on first use) and returns its bootstrap addresses and a function that
// stops it. It is what [RegisterEmbedded] takes.
type EmbeddedCluster func(partitions int32, topics []string) (brokers []string, stop func(), err error)

var embedded struct {
	mu    sync.Mutex
	start EmbeddedCluster
}

// RegisterEmbedded makes the [Embedded] broker usable by starting clusters
// with start. It is called by package github.com/spillway-go/spillway/embedded
// when that package is imported, the way a database/sql driver registers
// itself. A later call replaces the earlier one; it is safe for concurrent
// use.
func RegisterEmbedded(start EmbeddedCluster) {
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	embedded.start = start
}

// embeddedLinked reports whether an embedded broker is registered.
func embeddedLinked() bool {
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	return embedded.start != nil
}

// startEmbedded starts a registered embedded cluster, or returns
// [ErrEmbeddedNotLinked]. Each call starts a cluster of its own.
func startEmbedded(partitions int32, topics []string) (brokers []string, stop func(), err error) {
	embedded.mu.Lock()
	start := embedded.start
	embedded.mu.Unlock()
	if start == nil {
		return nil, nil, ErrEmbeddedNotLinked
	}
	brokers, stop, err = start(partitions, topics)
	if err != nil {
		return nil, nil, fmt.Errorf("kafkabroker: starting embedded broker: %w", err)
	}
	return brokers, stop, nil
}
