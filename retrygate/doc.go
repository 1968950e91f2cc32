// Package retrygate retries failed Watermill handlers without letting the
// retries take over a saturated consumer.
//
// Backpressure and retries pull against each other: under saturation,
// handlers time out, timeouts cause retries, retries add load, and a slow
// consumer becomes an unavailable one. A [Gate] breaks that loop:
//
//   - Failures are retried with exponential backoff and jitter
//     (cenkalti/backoff/v5). The gate sits outside the vertex budget
//     middleware, so a message holds no budget while it waits: each attempt
//     is admitted and refunded on its own.
//   - Every retry draws a token from a retry budget (golang.org/x/time/rate)
//     refilled at a steady rate and by a share of fresh traffic, so retries
//     can only add a bounded fraction to the load. No token, no retry now.
//   - While the pressure signal ([spillway.Pressure], implemented by
//     middleware.VertexBudget) reports saturation, nothing is retried in
//     process: a failed message is deferred to a retry topic (or nacked),
//     and redelivered work that arrives is deferred again before its handler
//     runs, so a consumer under pressure sheds retries first and fresh
//     messages keep flowing.
//   - Permanent errors ([Permanent], undecodable geometry) and messages out
//     of attempts go to a dead-letter topic with Watermill PoisonQueue
//     metadata. If that publish fails the message is nacked, never dropped.
//
// Every delivery ends in exactly one [Outcome] (handled, deferred,
// dead-lettered, nacked), counted in [Gate.Stats] and reported with its
// cause to the hook set by [WithOnOutcome].
//
// # Wiring
//
// Build the gate with the publisher of its retry and dead-letter copies,
// the configuration and options:
//
//	gate, err := retrygate.New(pub, cfg, retrygate.WithPressure(budget))
//
// Place it inside load shedding and outside budget admission:
//
//	router.AddMiddleware(policy.Middleware, gate.Middleware, admission.Middleware, policy.Admitted)
//
// and consume each topic's retry topic ([Config.RetryTopicFor]) with the
// same stack as the topic itself. docs/retries.md covers sizing and how the
// gate composes with Watermill's Retry, PoisonQueue and CircuitBreaker.
package retrygate
