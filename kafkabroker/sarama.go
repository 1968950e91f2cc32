package kafkabroker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/xdg-go/scram"

	"github.com/spillway-go/spillway"
)

// common sets what every Sarama client shares: protocol version, client
// id, TLS, SASL, timeouts.
func (k Config) common(c *sarama.Config) error {
	v, err := sarama.ParseKafkaVersion(k.Version)
	if err != nil {
		return &spillway.FieldError{Field: "version", Value: k.Version, Reason: "must be a Kafka version such as 3.6.0"}
	}
	c.Version = v
	c.ClientID = k.ClientID
	// Consumers and the shared client alike: telemetry/kafkatel reads the
	// client's isolation level to measure lag as a consumer sees it.
	c.Consumer.IsolationLevel = sarama.ReadUncommitted
	if k.IsolationLevel == isolationReadCommitted && v.IsAtLeast(sarama.V0_11_0_0) { // older: Validate reports it
		c.Consumer.IsolationLevel = sarama.ReadCommitted
	}
	// JoinGroup is answered only when every member has rejoined, which
	// may take up to the rebalance timeout; the read must outlast it.
	if rt := k.RebalanceTimeout + 5*time.Second; c.Net.ReadTimeout < rt {
		c.Net.ReadTimeout = rt
	}
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	if k.TLS.Enabled {
		tc, err := buildTLS(k.TLS)
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

// buildTLS builds the client TLS configuration of t.
func buildTLS(t spillway.TLSConfig) (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // opt-in, documented as tests only
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &spillway.FieldError{Field: "tls.ca_file", Value: t.CAFile, Reason: "cannot be read: " + ioReason(err)}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &spillway.FieldError{Field: "tls.ca_file", Value: t.CAFile, Reason: "holds no PEM certificate"}
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		certPEM, err := os.ReadFile(t.CertFile)
		if err != nil {
			return nil, &spillway.FieldError{Field: "tls.cert_file", Value: t.CertFile, Reason: "cannot be read: " + ioReason(err)}
		}
		keyPEM := []byte(t.KeyPEM)
		field, value := "tls.key_pem", t.KeyPEM.String()
		if t.KeyFile != "" {
			field, value = "tls.key_file", t.KeyFile
			keyPEM, err = os.ReadFile(t.KeyFile)
			if err != nil {
				return nil, &spillway.FieldError{Field: field, Value: value, Reason: "cannot be read: " + ioReason(err)}
			}
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			// The x509 error never quotes key material, but keep to a
			// fixed message anyway: this string may be logged.
			return nil, &spillway.FieldError{Field: field, Value: value, Reason: "is not a valid key for tls.cert_file"}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// saramaSubscriberConfig returns the Sarama consumer configuration chosen
// for backpressure (docs/kafka.md explains each value), with defaults
// applied to c. Pass it as kafka.SubscriberConfig.OverwriteSaramaConfig
// when wiring watermill-kafka by hand. A [*spillway.FieldError] reports a TLS file
// that cannot be used.
func (c Config) saramaSubscriberConfig() (*sarama.Config, error) {
	return c.WithDefaults().subscriberSarama(nil)
}

// saramaPublisherConfig returns the Sarama producer configuration, with
// defaults applied to c. Pass it as
// kafka.PublisherConfig.OverwriteSaramaConfig.
func (c Config) saramaPublisherConfig() (*sarama.Config, error) {
	return c.WithDefaults().publisherSarama(nil)
}

func (k Config) subscriberSarama(hook func(*sarama.Config) error) (*sarama.Config, error) {
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
	if limit := k.batchLimit(); limit > 0 {
		// Sarama grows a fetch that returned only part of a batch, up to
		// Fetch.Max; past it the partition fails with
		// ErrMessageTooLarge.
		c.Consumer.Fetch.Max = limit
		c.Consumer.Fetch.Default = min(c.Consumer.Fetch.Default, limit)
	}
	return finish(c, hook, "consumer")
}

func (k Config) publisherSarama(hook func(*sarama.Config) error) (*sarama.Config, error) {
	c := kafka.DefaultSaramaSyncPublisherConfig()
	if err := k.common(c); err != nil {
		return nil, err
	}
	if k.MaxMessageBytes > 0 {
		c.Producer.MaxMessageBytes = int(k.MaxMessageBytes)
	}
	c.Producer.Partitioner = partitionerFor(k.Partitioner)
	durable(c)
	return finish(c, hook, "producer")
}

// durable makes every publish wait until all in-sync replicas have the
// message: retry, dead-letter and audit copies are published before the
// original is acked, so a copy acknowledged by the leader alone could be
// lost with it while the original is already committed. From Kafka 0.11 the
// producer is also idempotent, so Sarama's own retries of a send whose
// acknowledgement was lost do not write the message twice; idempotence
// needs one request in flight per broker connection and at least one retry.
func durable(c *sarama.Config) {
	c.Producer.RequiredAcks = sarama.WaitForAll
	if c.Producer.Retry.Max < 1 {
		c.Producer.Retry.Max = 1
	}
	if c.Version.IsAtLeast(sarama.V0_11_0_0) {
		c.Producer.Idempotent = true
		c.Net.MaxOpenRequests = 1
	}
}

func (k Config) adminSarama(hook func(*sarama.Config) error) (*sarama.Config, error) {
	c := sarama.NewConfig()
	if err := k.common(c); err != nil {
		return nil, err
	}
	return finish(c, hook, "admin client")
}

// finish applies the caller's hook, last, and validates the result.
func finish(c *sarama.Config, hook func(*sarama.Config) error, what string) (*sarama.Config, error) {
	if hook != nil {
		if err := hook(c); err != nil {
			return nil, fmt.Errorf("kafkabroker: %s configuration hook: %w", what, err)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("kafkabroker: %s configuration: %w", what, err)
	}
	return c, nil
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

// ioReason is err without the path, which the FieldError already names.
func ioReason(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
