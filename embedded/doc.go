// Package embedded links in-process brokers into a program that asks for
// them: an embedded Kafka broker (kfake, a real Kafka wire-protocol broker
// from franz-go) and an embedded Redis server (miniredis).
//
// Import it for its side effects, the way a database/sql driver is
// imported:
//
//	import _ "github.com/spillway-go/spillway/embedded"
//
// It registers itself as the broker behind the address "embedded"
// (spillway.Embedded) of package kafkabroker (kafka.brokers) and package
// redisbroker (redis.addr). The
// Spillway library never imports it, so a program that does not ask for
// an embedded broker links neither fake broker. It lives in a module of its
// own, github.com/spillway-go/spillway/embedded, so its dependencies stay
// out of the library's module graph too.
//
// Embedded brokers are for demos, examples and tests. miniredis does not
// implement idle times, delivery counts or consumer-group lag the way Redis
// does, so claims, keep-alive and lag are approximate there; use a real
// redis-server to test them.
package embedded
