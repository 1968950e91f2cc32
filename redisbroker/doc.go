// Package redisbroker runs Spillway over Redis Streams: a Watermill
// publisher and subscriber built on watermill-redisstream and go-redis v9,
// plus the pieces a work-aware budget needs that upstream lacks.
//
// # Pieces
//
//   - [NewPublisher]: XADD per message, optionally trimming each stream to an
//     approximate MAXLEN (oldest entries go first, read or not).
//   - [Subscriber]: Config.Consumers consumers of one consumer group per
//     topic, each with a stable name and its own client, fanned in to one
//     channel. Each consumer hands over one message at a time and waits for
//     its ack (or up to Config.Window at once), so consumers × window is
//     the concurrency the vertex budget governs.
//   - the keep-alive ([KeepAliveConfig], [Subscriber.Stats]): keeps the
//     pending entries a subscriber holds (in a handler, waiting for budget,
//     or read ahead by upstream) from going idle, so a peer does not claim
//     and re-run slow but healthy work; after KeepAlive.MaxInFlight it
//     lets go, so stuck work is still recovered. It runs inside the
//     subscriber: nothing to install; [Subscriber.Stats] reports it. An
//     entry it loses is revoked ([Subscriber.Revoked]): a message waiting
//     for budget steps aside, and no ack is sent over a peer's claim.
//   - the delivery count ([Deliveries]) of every message, nacked
//     redeliveries included, and Config.MaxDeliveries: a delivery past it
//     is dead-lettered instead of run, so a payload that kills its
//     consumer cannot kill them all, and an entry whose handler keeps
//     failing is not retried for ever.
//   - [DeadLetter]: a handler middleware that moves entries that could not
//     be unmarshalled (instead of ending the subscription, as upstream
//     does), and entries delivered more than Config.MaxDeliveries times,
//     to a dead-letter stream.
//   - [Subscriber.Lag]: the consumer group's backlog per stream (entries
//     not yet delivered plus pending ones, from XINFO GROUPS, Redis 7),
//     read on demand; telemetry/redistel turns a subscriber's lag into a
//     source for the shared telemetry.LagSampler, which samples it in the
//     background.
//
// # Wiring
//
// With a Watermill router, add the dead-letter middleware outside (before)
// the budget:
//
//	sub, _ := redisbroker.NewSubscriber(cfg, redisbroker.WithLogger(logger))
//	pub, _ := redisbroker.NewPublisher(cfg, redisbroker.WithLogger(logger))
//	dl, _ := redisbroker.NewDeadLetter(cfg, redisbroker.WithPublisher(pub))
//	admission, _ := middleware.New(budget, middleware.WithRevoked(sub.Revoked))
//	router.AddMiddleware(
//		dl.Middleware,        // malformed entries never reach the budget or the handler
//		admission.Middleware, // waiters step aside when their entry is revoked
//	)
//
// and call sub.Completed(msg) when a handler succeeds, so its ack goes
// through even if the entry was revoked while it ran.
//
// The publisher and the subscriber each own their clients (upstream closes
// the client it is given); close both.
//
// # Delivery
//
// At least once. An entry is acked after its handler succeeds, and only
// while its consumer still owns it; a nacked message is redelivered to the
// same consumer after NackResendSleep; an entry whose consumer died is
// claimed by a peer after MaxIdleTime, the redelivery deadline. Connection errors are retried forever
// (go-redis reconnects); a consumer group lost with a server restarted
// without persistence is recreated. See docs/redis.md.
package redisbroker
