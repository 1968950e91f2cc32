// Package router runs Spillway's backpressure stack as a Watermill router on
// a broker chosen by configuration, so handler code never changes when the
// broker does.
//
// [New] builds, from a [Config], the Watermill router, the broker's
// publisher (wrapped so every message is stamped with its vertex_count and,
// with the producer section, rate-limited in vertices per second and
// throttled on consumer lag: [ProducerConfig]) and
// one subscriber per handler, and puts the Spillway middleware stack in
// front of every handler: tracing, metrics, dead-letter,
// shedding, retry gate and budget slots, outermost first. The budget is
// always there; tracing and metrics unless telemetry.disabled (they export
// to the providers given with [WithTelemetry], or OpenTelemetry's
// globals); shedding
// (shedding.topics), the retry gate (on unless retry.disabled) and the budget's
// auto-sizer (budget.autosize.enabled) are switched on by configuration,
// and the order is fixed in one place (router/stack.go).
// Handlers are added by name and topic with [Router.AddHandler] or
// [Router.AddConsumerHandler] (with the retry gate on, each also consumes
// its topic's retry topic); [Router.Run] runs them until [Router.Close] or
// its context ends (or a signal, with [WithSignals]: the router takes no
// signals unless asked), and shutdown is graceful: nothing new is admitted,
// waiters give up and are nacked, admitted work finishes within the close
// timeout.
//
// Events of the stack (admission, shedding drops, retry gate outcomes,
// auto-sizer resizes) reach values passed to [WithHooks] that have the
// methods OnAdmission, OnShed, OnRetryOutcome or OnResize; the router's
// telemetry.Metrics is the first such hook.
//
// Brokers:
//
//   - memory: Watermill's GoChannel, persistent. For tests and demos.
//   - kafka: watermill-kafka consumer groups over Sarama through package
//     kafkabroker (the kafka section is a [kafkabroker.Config]), either an
//     external cluster or, with brokers [spillway.Embedded], an in-process kfake
//     broker on loopback. Sarama is configured for backpressure (a small
//     window, the rebalance timeout as the redelivery deadline;
//     kafkabroker.WithSaramaConfig, given with [WithKafka], adjusts what the
//     section does not cover), and
//     admission is revocation-aware: see [kafkabroker.SessionTracker].
//   - redis: Redis Streams through package redisbroker (the redis section is
//     a [redisbroker.Config]): one subscriber, in
//     its own consumer group, per handler, with the keep-alive of held
//     entries built in; redis.max_idle_time is the redelivery deadline, and
//     entries that cannot be unmarshalled go to redis.dead_letter_topic
//     (the stack's dead-letter slot, outside the budget). Addr embedded
//     runs an in-process miniredis, for demos.
//   - custom: any Watermill publisher and subscribers, given in code with
//     [WithBroker] and its redelivery deadline ([CustomBroker]); the stack
//     runs over it unchanged.
//
// Configuration comes from a YAML file and SPILLWAY_* environment variables
// ([LoadConfig]; [LoadConfigSources] also says where each value came from,
// as "spillway config print" shows); docs/router.md is the reference, docs/kafka.md and
// docs/redis.md explain the brokers' mechanics and docs/operations.md the
// telemetry.
package router
