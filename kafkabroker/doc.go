// Package kafkabroker is Spillway's Kafka side, over watermill-kafka and
// Sarama: the configuration ([Config], the router's kafka section), the
// Sarama settings chosen for backpressure, and a [Cluster] that builds the
// publisher and the per-handler subscribers with them, creates topics and
// reads consumer lag.
//
// # Pieces
//
//   - [Config]: brokers, consumer groups, topics Spillway creates, the
//     window (channel buffer, fetch size), the rebalance timeout that is
//     the redelivery deadline, TLS and SASL. [Config.Validate] reports
//     [*spillway.FieldError]s.
//   - [Cluster]: [New] starts the embedded broker when asked for and
//     creates topics; [Cluster.NewPublisher] and [Cluster.NewSubscriber]
//     build the Watermill publisher and subscribers; [Cluster.Client] is
//     the shared Sarama client that telemetry/kafkatel reads lag over.
//     [WithSaramaConfig] is applied last to every Sarama configuration it
//     builds; [WithLogger] and [WithTracer] are optional too.
//   - [SessionTracker]: makes budget admission revocation-aware. A message
//     waiting for budget steps aside when its consumer-group session ends;
//     admitted work that finishes during a rebalance is still committed,
//     and [SessionTracker.Redelivered] tells broker redeliveries from
//     fresh messages. docs/kafka.md explains the mechanism.
//   - Consumer key ([ConsumerKey] in Config.Consumer): the subscriber
//     keeps many messages of a partition in flight at once, one at a time
//     per record key, within a per-partition window; the committed offset
//     is the contiguous completed watermark, committed on a Sarama client
//     of its own so that commits never wait behind fetches. docs/kafka.md,
//     "Consumer key".
//   - Durability: the publisher waits for all in-sync replicas and is
//     idempotent (Kafka 0.11 and later), and [Cluster.EnsureTopic] warns
//     about a single-replica topic on an external cluster.
//
// # Embedded broker
//
// Brokers [spillway.Embedded] asks for an in-process broker, linked in on
// request so the library itself never links a fake broker: a program that
// wants it imports github.com/spillway-go/spillway/embedded for its side
// effects; without that import, "embedded" is a configuration error that
// names the import ([spillway.ErrEmbeddedNotLinked]). The embedded broker speaks Kafka protocol
// 2.3.0 at most (2.3.0 is the default there); clusters get 3.6.0.
package kafkabroker
