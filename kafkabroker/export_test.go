package kafkabroker

import "github.com/IBM/sarama"

// Unexported names the external tests read.
const (
	BatchHeadroom            = batchHeadroom
	DefaultClientID          = defaultClientID
	DefaultFetchDefaultBytes = defaultFetchDefaultBytes
	EmbeddedVersion          = embeddedVersion
)

func (c Config) SaramaSubscriberConfig() (*sarama.Config, error) { return c.saramaSubscriberConfig() }
func (c Config) SaramaPublisherConfig() (*sarama.Config, error)  { return c.saramaPublisherConfig() }
func (c Config) SaramaAdminConfig() (*sarama.Config, error) {
	return c.WithDefaults().adminSarama(nil)
}
