// Package embedreg holds the in-process brokers behind the "embedded"
// address of kafkabroker and redisbroker. Package
// github.com/spillway-go/spillway/embedded registers them when it is
// imported, the way a database/sql driver registers itself, so the
// library never links a fake broker on its own. Tests register their own.
// Every function is safe for concurrent use.
package embedreg

import "sync"

// KafkaFunc starts an in-process Kafka broker whose topics have partitions
// partitions (topics are created up front; others are created on first
// use) and returns its bootstrap addresses and a function that stops it.
// Each call starts a cluster of its own.
type KafkaFunc func(partitions int32, topics []string) (brokers []string, stop func(), err error)

// RedisFunc starts an in-process Redis server and returns its address and
// a function that stops it.
type RedisFunc func() (addr string, stop func(), err error)

var reg struct {
	mu    sync.Mutex
	kafka KafkaFunc
	redis RedisFunc
}

// RegisterKafka makes f the embedded Kafka broker; nil unregisters it. A
// later call replaces an earlier one.
func RegisterKafka(f KafkaFunc) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	reg.kafka = f
}

// RegisterRedis makes f the embedded Redis server; nil unregisters it. A
// later call replaces an earlier one.
func RegisterRedis(f RedisFunc) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	reg.redis = f
}

// Kafka returns the registered Kafka broker, or nil.
func Kafka() KafkaFunc {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	return reg.kafka
}

// Redis returns the registered Redis server, or nil.
func Redis() RedisFunc {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	return reg.redis
}
