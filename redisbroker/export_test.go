package redisbroker

// RefreshScript exposes the keep-alive's refresh script to the tests.
var RefreshScript = refreshScript

// Unexported names the external tests read.
const (
	DefaultConsumers       = defaultConsumers
	DefaultBlockTime       = defaultBlockTime
	DefaultMaxIdleTime     = defaultMaxIdleTime
	DefaultClaimInterval   = defaultClaimInterval
	DefaultNackResendSleep = defaultNackResendSleep
	DefaultMaxInFlight     = defaultMaxInFlight
	DefaultDeadLetterTopic = defaultDeadLetterTopic

	MetadataConsumer         = metadataConsumer
	MetadataEntryID          = metadataEntryID
	MetadataMalformed        = metadataMalformed
	MetadataDeadLetterSource = metadataDeadLetterSource
	MetadataDeadLetterID     = metadataDeadLetterID
	MetadataDeadLetterReason = metadataDeadLetterReason
)

var DefaultConsumerName = defaultConsumerName

func (c Config) ConsumerNames() []string  { return c.consumerNames() }
func (s *Subscriber) Consumers() []string { return s.consumers() }
func (d *DeadLetter) Topic() string       { return d.cfg.Topic }
