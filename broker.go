package spillway

import "errors"

// Embedded is the broker address that asks for an in-process broker
// instead of a real one: kafkabroker's Brokers [embedded] and redisbroker's
// Addr "embedded". It is meant for demos and needs package
// github.com/spillway-go/spillway/embedded imported for its side effects;
// without it, configurations that use it fail with [ErrEmbeddedNotLinked].
const Embedded = "embedded"

// ErrEmbeddedNotLinked is returned when a configuration asks for the
// [Embedded] broker but the program does not import the package that
// provides it. The message gives the import and, since embedded is a
// module of its own, the go.mod replace a module outside the repository
// needs while the modules are unpublished.
var ErrEmbeddedNotLinked = errors.New(`the "embedded" broker needs the embedded package: add import _ "github.com/spillway-go/spillway/embedded" ` +
	`(a module of its own: until it is published, your go.mod also needs replace github.com/spillway-go/spillway/embedded => ../spillway/embedded, ` +
	`beside the one for github.com/spillway-go/spillway; see docs/quickstart.md)`)

// ErrClosed is returned when a closed broker client is used: a
// kafkabroker Cluster, a redisbroker publisher or Subscriber. Match it with
// errors.Is; the error names the package that returned it.
var ErrClosed = errors.New("closed")
