// Package dlhint lets the router hear, outside the public API, of each
// message the Redis dead-letter middleware (redisbroker.DeadLetter) moves,
// so that it counts the move without a middleware of its own around that
// one: every layer of the stack is a frame on every message's stack
// (internal/stackroom), while a move is rare.
package dlhint

import "github.com/ThreeDotsLabs/watermill/message"

// OnMoved makes d, a *redisbroker.DeadLetter not yet in use, call moved
// after each message it moves to the dead-letter topic, with whether the
// message was malformed (otherwise its entry was delivered too many
// times). Set by package redisbroker as it is initialised.
var OnMoved func(d any, moved func(msg *message.Message, malformed bool))
