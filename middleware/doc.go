// Package middleware admits Watermill messages by the work they carry: it
// is the consumer side of work-aware backpressure. The producer side, rate
// limiting in vertices per second and throttling on consumer lag, is
// package producer.
//
// [VertexBudget] is a weighted, FIFO semaphore measured in vertices (and,
// optionally, in messages), built with [NewVertexBudget]. The [Admitter]
// built by [New] is the Watermill middleware that charges each message's
// [cost.Charge] against a VertexBudget before the handler runs and refunds
// it when the handler returns, fails or panics:
//
//	budget, err := middleware.NewVertexBudget(200_000)
//	...
//	admission, err := middleware.New(budget, middleware.WithOnAdmission(metrics.OnAdmission))
//	...
//	router.AddMiddleware(admission.Middleware)
//
// Both constructors take the package's [Option]s, each of which belongs to
// one of them. While the handler runs, the message's context carries the
// charge it was admitted with: layers inside the admission read it with
// [cost.AdmittedFromCtx] instead of pricing the message again (the
// auto-sizer in package sizing does), and a layer that replaces the
// message's context passes it on with [cost.WithAdmitted]. A budget's
// capacity is at most 2⁴⁰ vertices, and its arithmetic never overflows.
//
// [WithMaxPayloadBytes] and [WithMaxVertices] refuse a message that is too
// big to run at all (a payload above what memory can decode, a message
// larger than one core finishes inside the deadline): it is not clamped
// and run alone but handed to [WithOnOversize]'s function, or fails with
// [ErrOversize], which a retry gate dead-letters.
//
// Watermill's router starts one goroutine per delivered message and has no
// concurrency limit of its own: concurrency is whatever the subscriber
// releases without an ack. The budget therefore sits inside the handler
// chain and blocks the message's goroutine, not the subscriber. While a
// message waits it stays unacked, so the subscriber delivers nothing new
// from that partition (watermill-kafka holds one unacked message per
// partition) or that subscription (watermill-redisstream processes one
// message at a time), and the broker session stays alive: Sarama heartbeats
// on its own goroutine, and Redis needs no heartbeat at all.
//
// What a waiting message does hold is its redelivery deadline. On Kafka an
// unacked message delays any rebalance, and past Rebalance.Timeout the
// member is evicted and the message redelivered; on Redis Streams an entry
// pending longer than MaxIdleTime is claimed by a peer even while the first
// handler still runs. Size the budget so that admitted work drains within
// half of that deadline, and give waiting messages a way to step aside when
// their delivery is revoked ([WithRevoked]).
package middleware
