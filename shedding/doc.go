// Package shedding drops messages, deliberately and visibly, when keeping
// them would only grow a backlog that never drains.
//
// Budget admission (package middleware) blocks work it cannot afford; the
// broker holds the rest. That is right for every stream whose messages all
// matter. It is wrong for self-superseding streams, vehicle positions or
// sensor telemetry, where each message is replaced by the next one for the
// same entity: under sustained overload their backlog is worth less every
// second, and dropping the part that a later message replaces anyway is the
// only way to catch up.
//
// A [Policy] does that, for an explicit allow-list of topics and nothing
// else:
//
//   - Priority shedding: once the pressure signal ([spillway.Pressure], satisfied by
//     *middleware.VertexBudget) has reported pressure for a window (30 s by
//     default) without a break, a message whose region priority is below a
//     threshold is dropped before it waits for budget. Shedding stops as
//     soon as the pressure clears.
//   - Version guard: a message whose version is not newer than the last one
//     handled for its entity is stale and dropped. Its memory is a
//     size-bounded LRU.
//   - Keyed coalescing: while messages of one entity wait for budget, only
//     the newest proceeds; an older waiter is dropped as superseded the
//     moment a newer one arrives. Admitted work is never interrupted.
//     "Newer" is the higher version when both carry one; otherwise it is
//     arrival order only, and a redelivery or retry copy
//     ([WithRedelivery]) never supersedes.
//
// A dropped message is acked, counted by topic and reason, reported to an
// optional hook, and, if an audit topic is configured, published there
// first with its reason in metadata; if that publish fails the message is
// nacked instead, so nothing disappears silently.
//
// The policy is two middlewares on either side of budget admission,
// [Policy.Middleware] outside and [Policy.Admitted] inside, plus a
// revocation hook for the budget ([Policy.Revoked]):
//
//	pol, err := shedding.New(cfg, shedding.WithPressure(budget), shedding.WithAuditPublisher(pub))
//	admission, err := middleware.New(budget,
//		middleware.WithRevoked(pol.Revoked(nil))) // or pol.Revoked(tracker.Revoked) on Kafka
//	router.AddMiddleware(pol.Middleware, admission.Middleware, pol.Admitted)
//
// docs/shedding.md explains when to drop, block or buffer, why the topic
// list is explicit, and what to alert on.
package shedding
