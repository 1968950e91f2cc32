package kafkabroker

import (
	"fmt"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/embedreg"
)

// embeddedLinked reports whether an embedded broker is registered (by
// importing package github.com/spillway-go/spillway/embedded).
func embeddedLinked() bool { return embedreg.Kafka() != nil }

// startEmbedded starts a registered embedded cluster, or returns
// [spillway.ErrEmbeddedNotLinked]. Each call starts a cluster of its own.
func startEmbedded(partitions int32, topics []string) (brokers []string, stop func(), err error) {
	start := embedreg.Kafka()
	if start == nil {
		return nil, nil, fmt.Errorf("kafkabroker: brokers [embedded]: %w", spillway.ErrEmbeddedNotLinked)
	}
	brokers, stop, err = start(partitions, topics)
	if err != nil {
		return nil, nil, fmt.Errorf("kafkabroker: starting embedded broker: %w", err)
	}
	return brokers, stop, nil
}
