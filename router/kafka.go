package router

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/xdg-go/scram"

	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/telemetry/kafkatel"
)

// kafkaBackend runs handlers as watermill-kafka consumer groups.
type kafkaBackend struct {
	cfg    KafkaConfig
	logger watermill.LoggerAdapter
	opts   options

	stopEmbedded func() // stops the embedded broker, nil for an external cluster
	brokers      []string

	marshaler kafka.MarshalerUnmarshaler
	pub       *kafka.Publisher

	mu         sync.Mutex
	client     sarama.Client // lazily, for topic creation and lag
	admin      sarama.ClusterAdmin
	lagSources map[groupTopic]*kafkatel.LagSource
}

func newKafkaBackend(cfg KafkaConfig, logger watermill.LoggerAdapter, o options) (*kafkaBackend, error) {
	b := &kafkaBackend{cfg: cfg, logger: logger, opts: o, brokers: cfg.Brokers, lagSources: make(map[groupTopic]*kafkatel.LagSource)}
	keyField := cfg.KeyMetadata
	b.marshaler = kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		if k := msg.Metadata.Get(keyField); k != "" {
			return k, nil
		}
		// No entity key: spread by UUID. An empty key would hash every
		// such message onto one partition.
		return msg.UUID, nil
	})

	if cfg.embedded() {
		brokers, stop, err := kafkabroker.StartEmbedded(cfg.Partitions, cfg.Topics)
		if err != nil {
			return nil, fmt.Errorf("router: kafka: %w", err)
		}
		b.stopEmbedded = stop
		b.brokers = brokers
		logger.Info("Embedded Kafka broker started", watermill.LogFields{"brokers": fmt.Sprint(b.brokers)})
	} else if cfg.CreateTopics {
		for _, t := range cfg.Topics {
			if err := b.ensureTopic(t); err != nil {
				_ = b.close()
				return nil, err
			}
		}
	}

	pcfg, err := b.publisherSarama()
	if err != nil {
		_ = b.close()
		return nil, err
	}
	b.pub, err = kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               b.brokers,
		Marshaler:             b.marshaler,
		OverwriteSaramaConfig: pcfg,
		Tracer:                o.tracer,
	}, logger)
	if err != nil {
		_ = b.close()
		return nil, fmt.Errorf("router: kafka: publisher: %w", err)
	}
	return b, nil
}

func (k KafkaConfig) embedded() bool {
	return len(k.Brokers) == 1 && k.Brokers[0] == Embedded
}

// Brokers returns the bootstrap addresses the router's Kafka clients use:
// the configured ones, or the embedded broker's loopback address. Nil for
// other brokers.
func (r *Router) Brokers() []string {
	if b, ok := r.back.(*kafkaBackend); ok {
		return append([]string(nil), b.brokers...)
	}
	return nil
}

// ConsumerGroup returns the Kafka consumer group of the handler named
// handler.
func (c KafkaConfig) consumerGroup(handler string) string {
	return c.ConsumerGroup + "." + handler
}

func (b *kafkaBackend) group(handler string) string { return b.cfg.consumerGroup(handler) }

// common sets what every Sarama client of the router shares: protocol
// version, client id, TLS, SASL, timeouts.
func (k KafkaConfig) common(c *sarama.Config) error {
	v, err := sarama.ParseKafkaVersion(k.Version)
	if err != nil {
		return &ConfigError{Field: "kafka.version", Value: k.Version, Reason: "must be a Kafka version such as 2.8.0"}
	}
	c.Version = v
	c.ClientID = k.ClientID
	// JoinGroup is answered only when every member has rejoined, which
	// may take up to the rebalance timeout; the read must outlast it.
	if rt := k.RebalanceTimeout + 5*time.Second; c.Net.ReadTimeout < rt {
		c.Net.ReadTimeout = rt
	}
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	if k.TLS.Enabled {
		tc, err := k.TLS.build()
		if err != nil {
			return err
		}
		c.Net.TLS.Enable = true
		c.Net.TLS.Config = tc
	}
	if k.SASL.Mechanism != "" {
		c.Net.SASL.Enable = true
		c.Net.SASL.Handshake = true
		c.Net.SASL.Mechanism = sarama.SASLMechanism(k.SASL.Mechanism)
		c.Net.SASL.User = k.SASL.User
		c.Net.SASL.Password = string(k.SASL.Password)
		switch k.SASL.Mechanism {
		case sarama.SASLTypeSCRAMSHA256:
			c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA256} }
		case sarama.SASLTypeSCRAMSHA512:
			c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA512} }
		}
	}
	return nil
}

func (t TLSConfig) build() (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // opt-in, documented as tests only
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &ConfigError{Field: "kafka.tls.ca_file", Value: t.CAFile, Reason: "cannot be read: " + ioReason(err)}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &ConfigError{Field: "kafka.tls.ca_file", Value: t.CAFile, Reason: "holds no PEM certificate"}
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		certPEM, err := os.ReadFile(t.CertFile)
		if err != nil {
			return nil, &ConfigError{Field: "kafka.tls.cert_file", Value: t.CertFile, Reason: "cannot be read: " + ioReason(err)}
		}
		keyPEM := []byte(t.KeyPEM)
		field, value := "kafka.tls.key_pem", t.KeyPEM.String()
		if t.KeyFile != "" {
			field, value = "kafka.tls.key_file", t.KeyFile
			keyPEM, err = os.ReadFile(t.KeyFile)
			if err != nil {
				return nil, &ConfigError{Field: field, Value: value, Reason: "cannot be read: " + ioReason(err)}
			}
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			// The x509 error never quotes key material, but keep to a
			// fixed message anyway: this string may be logged.
			return nil, &ConfigError{Field: field, Value: value, Reason: "is not a valid key for kafka.tls.cert_file"}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// subscriberSarama is the consumer configuration, chosen for backpressure
// (docs/kafka.md explains each value).
func (b *kafkaBackend) subscriberSarama() (*sarama.Config, error) {
	k := b.cfg
	c := kafka.DefaultSaramaSubscriberConfig()
	if err := k.common(c); err != nil {
		return nil, err
	}
	// A small window: how many messages per partition Sarama holds ahead
	// of the one watermill-kafka has delivered, and how much it fetches.
	c.ChannelBufferSize = k.ChannelBufferSize
	c.Consumer.Fetch.Default = k.FetchDefaultBytes
	c.Consumer.Return.Errors = true
	if k.InitialOffset == "newest" {
		c.Consumer.Offsets.Initial = sarama.OffsetNewest
	} else {
		c.Consumer.Offsets.Initial = sarama.OffsetOldest
	}
	c.Consumer.Group.Rebalance.Timeout = k.RebalanceTimeout
	c.Consumer.Group.Session.Timeout = k.SessionTimeout
	c.Consumer.Group.Heartbeat.Interval = k.HeartbeatInterval
	if b.opts.saramaHook != nil {
		b.opts.saramaHook(true, c)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("router: kafka: consumer configuration: %w", err)
	}
	return c, nil
}

func (b *kafkaBackend) publisherSarama() (*sarama.Config, error) {
	c := kafka.DefaultSaramaSyncPublisherConfig()
	if err := b.cfg.common(c); err != nil {
		return nil, err
	}
	if b.opts.saramaHook != nil {
		b.opts.saramaHook(false, c)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("router: kafka: producer configuration: %w", err)
	}
	return c, nil
}

func (b *kafkaBackend) publisher() message.Publisher { return b.pub }

func (b *kafkaBackend) subscriber(handler, _ string) (message.Subscriber, *SessionTracker, error) {
	scfg, err := b.subscriberSarama()
	if err != nil {
		return nil, nil, err
	}
	tr := NewSessionTracker(b.opts.tracer)
	tr.observeOnly = b.opts.noRevocation
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               b.brokers,
		Unmarshaler:           tr.WrapUnmarshaler(b.marshaler),
		OverwriteSaramaConfig: scfg,
		ConsumerGroup:         b.cfg.consumerGroup(handler),
		NackResendSleep:       b.cfg.NackResendSleep,
		ReconnectRetrySleep:   time.Second,
		Tracer:                tr,
	}, b.logger)
	if err != nil {
		return nil, nil, fmt.Errorf("router: kafka: subscriber for %s: %w", handler, err)
	}
	return sub, tr, nil
}

// adminClient returns the shared client and cluster admin, creating them
// on first use.
func (b *kafkaBackend) adminClient() (sarama.Client, sarama.ClusterAdmin, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.admin != nil {
		return b.client, b.admin, nil
	}
	c := sarama.NewConfig()
	if err := b.cfg.common(c); err != nil {
		return nil, nil, err
	}
	client, err := sarama.NewClient(b.brokers, c)
	if err != nil {
		return nil, nil, fmt.Errorf("router: kafka: connecting to %v: %w", b.brokers, err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		_ = client.Close()
		return nil, nil, fmt.Errorf("router: kafka: cluster admin: %w", err)
	}
	b.client, b.admin = client, admin
	return client, admin, nil
}

func (b *kafkaBackend) ensureTopic(topic string) error {
	if !b.cfg.embedded() && !b.cfg.CreateTopics {
		return nil
	}
	_, admin, err := b.adminClient()
	if err != nil {
		return err
	}
	err = admin.CreateTopic(topic, &sarama.TopicDetail{
		NumPartitions:     b.cfg.Partitions,
		ReplicationFactor: b.cfg.ReplicationFactor,
	}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("router: kafka: creating topic %s: %w", topic, err)
	}
	return nil
}

// lag reads each handler group's lag per partition with kafkatel (the
// high-water mark minus the committed offset; a partition never committed
// counts from its oldest retained offset), one source per handler, built
// on first use over the shared client.
func (b *kafkaBackend) lag(ctx context.Context, groups []groupTopic) ([]telemetry.LagSample, error) {
	client, _, err := b.adminClient()
	if err != nil {
		return nil, err
	}
	var out []telemetry.LagSample
	for _, g := range groups {
		b.mu.Lock()
		src := b.lagSources[g]
		if src == nil {
			src, err = kafkatel.NewLagSource(client, b.cfg.consumerGroup(g.handler), g.topic)
			if err != nil {
				b.mu.Unlock()
				return nil, fmt.Errorf("router: kafka: lag: %w", err)
			}
			b.lagSources[g] = src
		}
		b.mu.Unlock()
		samples, err := src.Lag(ctx)
		if err != nil {
			return nil, fmt.Errorf("router: kafka: lag: %w", err)
		}
		out = append(out, samples...)
	}
	return out, nil
}

func (b *kafkaBackend) deadLetter() message.HandlerMiddleware { return nil }

func (b *kafkaBackend) system() string { return telemetry.SystemKafka }

func (b *kafkaBackend) close() error {
	var errs []error
	b.mu.Lock()
	if b.admin != nil {
		// Closing the admin closes the client it was made from.
		if err := b.admin.Close(); err != nil {
			errs = append(errs, err)
		}
		b.admin, b.client = nil, nil
		clear(b.lagSources)
	}
	b.mu.Unlock()
	if b.stopEmbedded != nil {
		b.stopEmbedded()
		b.stopEmbedded = nil
	}
	return errors.Join(errs...)
}

// scramClient adapts xdg-go/scram to Sarama's SCRAMClient.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (c *scramClient) Begin(user, password, authzID string) error {
	cl, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	c.conv = cl.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) { return c.conv.Step(challenge) }

func (c *scramClient) Done() bool { return c.conv.Done() }

// ioReason is err without the path, which the ConfigError already names.
func ioReason(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
