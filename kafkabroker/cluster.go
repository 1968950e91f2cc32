package kafkabroker

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/copyctx"
)

// errClosed is returned by a closed [Cluster].
var errClosed = fmt.Errorf("kafkabroker: %w", spillway.ErrClosed)

// errReplicationFactorOne is logged with the warning about a topic that has
// a single replica.
var errReplicationFactorOne = errors.New("kafkabroker: topic has replication factor 1")

// Option customises a [Cluster] beyond its Config.
type Option func(*options)

type options struct {
	tracer     kafka.SaramaTracer
	saramaHook func(*sarama.Config) error
	logger     watermill.LoggerAdapter
}

// WithLogger makes the cluster, its publisher and its subscribers log to
// logger. Without it (or with nil) they log nothing.
func WithLogger(logger watermill.LoggerAdapter) Option {
	return func(o *options) { o.logger = logger }
}

// WithTracer composes a watermill-kafka tracer (for example
// kafka.NewOTELSaramaTracer()) with the subscribers' session trackers; the
// publisher uses it as is.
func WithTracer(t kafka.SaramaTracer) Option {
	return func(o *options) { o.tracer = t }
}

// WithSaramaConfig calls f on every Sarama configuration the cluster
// builds (publisher, subscribers, the admin and lag client) after
// Spillway's settings, just before Sarama validates it: an escape hatch
// for settings Config does not cover. An error from f fails the
// constructor that asked for the configuration.
func WithSaramaConfig(f func(*sarama.Config) error) Option {
	return func(o *options) { o.saramaHook = f }
}

// Cluster is Spillway's handle on one Kafka cluster, external or
// embedded: it builds the publisher and the per-handler subscribers with
// the backpressure Sarama settings, creates topics, and reads consumer
// lag. Open it once per router (or per process) and Close it after every
// publisher and subscriber it made.
//
// A Cluster is safe for concurrent use.
type Cluster struct {
	cfg    Config
	logger watermill.LoggerAdapter
	opts   options

	stopEmbedded func() // stops the embedded broker, nil for an external cluster
	brokers      []string
	marshaler    kafka.MarshalerUnmarshaler
	seen         *offsetMemory // offsets received, for SessionTracker.Redelivered

	mu     sync.Mutex
	closed bool
	client sarama.Client // lazily, for topic creation and lag
	admin  sarama.ClusterAdmin

	replChecked map[string]bool // topics whose replication factor was read
}

// New validates cfg (after defaults), starts the embedded broker when
// Brokers is [spillway.Embedded], and creates cfg.Topics when it must
// (embedded broker, or CreateTopics). Configuration problems are
// [*spillway.FieldError]s.
func New(cfg Config, opts ...Option) (*Cluster, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, brokers: cfg.Brokers, seen: newOffsetMemory()}
	for _, o := range opts {
		if o != nil {
			o(&c.opts)
		}
	}
	logger := c.opts.logger
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	c.logger = logger
	keyField := cfg.KeyMetadata
	c.marshaler = kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		// A retry, dead-letter or oversize copy keeps the key of the
		// record it copies, whoever produced that record.
		if ctx := msg.Context(); copyctx.Is(ctx) {
			if k, ok := KeyFromCtx(ctx); ok && len(k) > 0 {
				return string(k), nil
			}
		}
		if k := msg.Metadata.Get(keyField); k != "" {
			return k, nil
		}
		// No entity key: spread by UUID. An empty key would hash every
		// such message onto one partition.
		if msg.UUID != "" {
			return msg.UUID, nil
		}
		// No UUID either (a copy of another client's record that had no
		// key): a random key spreads it as a missing key would.
		return watermill.NewUUID(), nil
	})
	if cfg.embedded() {
		upFront := cfg.Topics
		if cfg.MaxMessageBytes > 0 {
			// Created below instead, with their max.message.bytes.
			upFront = nil
		}
		brokers, stop, err := startEmbedded(cfg.Partitions, upFront)
		if err != nil {
			return nil, err
		}
		c.stopEmbedded = stop
		c.brokers = brokers
		logger.Info("Embedded Kafka broker started", watermill.LogFields{"brokers": fmt.Sprint(c.brokers)})
	}
	if cfg.CreateTopics || (cfg.embedded() && cfg.MaxMessageBytes > 0) {
		for _, t := range cfg.Topics {
			if err := c.EnsureTopic(t); err != nil {
				_ = c.Close()
				return nil, err
			}
		}
	}
	// Build the producer configuration once now, so a bad TLS file or
	// hook fails here rather than at the first publisher.
	if _, err := cfg.publisherSarama(c.opts.saramaHook); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// probe checks, before a client connects to an external cluster, that
// some broker address answers as Kafka (see [ErrNotKafkaListener]).
func (c *Cluster) probe(sc *sarama.Config) error {
	if c.cfg.embedded() {
		return nil
	}
	return probe(c.brokers, sc)
}

// Brokers returns the bootstrap addresses the cluster's clients use: the
// configured ones, or the embedded broker's loopback address.
func (c *Cluster) Brokers() []string { return append([]string(nil), c.brokers...) }

// NewPublisher returns a watermill-kafka publisher keyed by
// Config.KeyMetadata (a message without it is keyed by its UUID), placed
// by Config.Partitioner. A retry, dead-letter or oversize copy the router
// or the retry gate publishes keeps the Kafka key of the record it copies. The caller closes it.
func (c *Cluster) NewPublisher() (*kafka.Publisher, error) {
	pcfg, err := c.cfg.publisherSarama(c.opts.saramaHook)
	if err != nil {
		return nil, err
	}
	if err := c.probe(pcfg); err != nil {
		return nil, fmt.Errorf("kafkabroker: publisher: %w", err)
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               c.brokers,
		Marshaler:             c.marshaler,
		OverwriteSaramaConfig: pcfg,
		Tracer:                c.opts.tracer,
	}, c.logger)
	if err != nil {
		return nil, fmt.Errorf("kafkabroker: publisher: %w", listenerHint(err, c.brokers))
	}
	return pub, nil
}

// NewSubscriber returns a subscriber in consumer group group, in the mode
// Config.Consumer names, and the [SessionTracker] that makes budget
// admission on it revocation-aware (pass tracker.Revoked to the budget,
// and call Begin and Completed around admission; the router does this).
// The caller closes the subscriber.
//
// With [ConsumerPartition] it is watermill-kafka's subscriber: one message
// per partition in flight. With [ConsumerKey] it hands over many records
// of a partition at once, one at a time per record key, within a
// per-partition window (Config.WindowMessages and Config.WindowBytes);
// the committed offset is the contiguous completed watermark. Handlers
// see the same *message.Message in both modes, with the partition,
// offset, timestamp and key in its context, read with [PartitionFromCtx]
// and its siblings. docs/kafka.md, "Consumer key", gives the guarantees
// of key mode.
func (c *Cluster) NewSubscriber(group string) (message.Subscriber, *SessionTracker, error) {
	if c.cfg.Consumer == ConsumerKey {
		ks, tr, err := c.newKeySubscriber(group)
		if err != nil {
			return nil, nil, err // not a nil *keySubscriber in an interface
		}
		return ks, tr, nil
	}
	scfg, err := c.cfg.subscriberSarama(c.opts.saramaHook)
	if err != nil {
		return nil, nil, err
	}
	pt := newPartitionTracker(c.opts.tracer, group, c.seen)
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               c.brokers,
		Unmarshaler:           pt.wrapUnmarshaler(c.marshaler),
		OverwriteSaramaConfig: scfg,
		ConsumerGroup:         group,
		NackResendSleep:       c.cfg.NackResendSleep,
		ReconnectRetrySleep:   time.Second,
		Tracer:                pt.st.tracer(),
	}, c.logger)
	if err != nil {
		return nil, nil, fmt.Errorf("kafkabroker: subscriber for group %s: %w", group, err)
	}
	return sub, pt.st, nil
}

// adminClient returns the shared client and cluster admin, creating them
// on first use.
func (c *Cluster) adminClient() (sarama.Client, sarama.ClusterAdmin, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, errClosed
	}
	if c.admin != nil {
		return c.client, c.admin, nil
	}
	sc, err := c.cfg.adminSarama(c.opts.saramaHook)
	if err != nil {
		return nil, nil, err
	}
	if err := c.probe(sc); err != nil {
		return nil, nil, fmt.Errorf("kafkabroker: connecting to %v: %w", c.brokers, err)
	}
	client, err := sarama.NewClient(c.brokers, sc)
	if err != nil {
		return nil, nil, fmt.Errorf("kafkabroker: connecting to %v: %w", c.brokers, listenerHint(err, c.brokers))
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		_ = client.Close()
		return nil, nil, fmt.Errorf("kafkabroker: cluster admin: %w", err)
	}
	c.client, c.admin = client, admin
	return client, admin, nil
}

// EnsureTopic creates topic with Config.Partitions partitions,
// Config.ReplicationFactor replicas and, with Config.MaxMessageBytes, a
// max.message.bytes that admits such a message, if it is missing, on the
// embedded broker or with Config.CreateTopics; otherwise it creates
// nothing. An existing topic is left as it is.
//
// On an external cluster it then reads the topic's replication factor,
// once per topic, and logs a warning if it is 1: a copy published there
// (retry, dead-letter, audit) lives on one broker only, so losing that
// broker loses it even though the original was committed after it.
// Failing to read it is logged too, never returned.
func (c *Cluster) EnsureTopic(topic string) error {
	if !c.cfg.embedded() && !c.cfg.CreateTopics {
		c.checkReplication(topic)
		return nil
	}
	_, admin, err := c.adminClient()
	if err != nil {
		return err
	}
	detail := &sarama.TopicDetail{
		NumPartitions:     c.cfg.Partitions,
		ReplicationFactor: c.cfg.ReplicationFactor,
	}
	if limit := c.cfg.batchLimit(); limit > 0 {
		v := strconv.Itoa(int(limit))
		detail.ConfigEntries = map[string]*string{"max.message.bytes": &v}
	}
	err = admin.CreateTopic(topic, detail, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("kafkabroker: creating topic %s: %w", topic, err)
	}
	if !c.cfg.embedded() {
		c.checkReplication(topic)
	}
	return nil
}

// checkReplication warns, once per topic, when topic has a single replica
// on an external cluster. Before Kafka 0.11 a metadata request may create
// the topic it names, so the check is skipped there.
func (c *Cluster) checkReplication(topic string) {
	if v, err := sarama.ParseKafkaVersion(c.cfg.Version); err != nil || !v.IsAtLeast(sarama.V0_11_0_0) {
		return
	}
	c.mu.Lock()
	if c.replChecked == nil {
		c.replChecked = make(map[string]bool)
	}
	done := c.replChecked[topic]
	c.replChecked[topic] = true
	c.mu.Unlock()
	if done {
		return
	}
	fields := watermill.LogFields{"topic": topic}
	_, admin, err := c.adminClient()
	if err != nil {
		c.mu.Lock()
		delete(c.replChecked, topic) // try again next time
		c.mu.Unlock()
		c.logger.Info("Cannot read the replication factor of a Kafka topic", fields.Add(watermill.LogFields{"err": err.Error()}))
		return
	}
	md, err := admin.DescribeTopics([]string{topic})
	if err != nil || len(md) != 1 || md[0].Err != sarama.ErrNoError {
		if err == nil && len(md) == 1 {
			err = md[0].Err
		}
		c.mu.Lock()
		delete(c.replChecked, topic) // try again next time
		c.mu.Unlock()
		c.logger.Info("Cannot read the replication factor of a Kafka topic", fields.Add(watermill.LogFields{"err": fmt.Sprint(err)}))
		return
	}
	replicas := 0
	for _, p := range md[0].Partitions {
		if replicas == 0 || len(p.Replicas) < replicas {
			replicas = len(p.Replicas)
		}
	}
	if replicas == 1 {
		c.logger.Error("Kafka topic has replication factor 1: copies published to it (retry, dead-letter, audit) are lost with its broker; use replication factor 3 and min.insync.replicas 2",
			errReplicationFactorOne, fields)
	}
}

// Client returns the cluster's shared Sarama client, connected on first
// use, for reading metadata and offsets: telemetry/kafkatel.NewLagSource
// reads a group's lag over it. It lives until Close; do not close it
// yourself. After Close it fails with an error matching
// [spillway.ErrClosed].
func (c *Cluster) Client() (sarama.Client, error) {
	client, _, err := c.adminClient()
	return client, err
}

// Close closes the shared client and stops the embedded broker. Close
// the publishers and subscribers first. Later calls return nil;
// EnsureTopic and Client then fail with an error matching
// [spillway.ErrClosed].
func (c *Cluster) Close() error {
	var errs []error
	c.mu.Lock()
	c.closed = true
	if c.admin != nil {
		// Closing the admin closes the client it was made from.
		if err := c.admin.Close(); err != nil {
			errs = append(errs, err)
		}
		c.admin, c.client = nil, nil
	}
	stop := c.stopEmbedded
	c.stopEmbedded = nil
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
	return errors.Join(errs...)
}
