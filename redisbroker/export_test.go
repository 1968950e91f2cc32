package redisbroker

import "context"

// RefreshScript exposes the keep-alive's refresh script to the tests.
var RefreshScript = refreshScript

// AckScript exposes the acker's owner-checked ack script to the tests.
var AckScript = ackScript

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
func (d *DeadLetter) Topic() string       { return d.topic }

// Unexported types and functions the external tests use.
type (
	Entry          = entry
	MalformedEntry = malformedEntry
	LagInfo        = lagInfo
)

var (
	EntryOf     = entryOf
	Lag         = readLag
	ErrNoStream = errNoStream
	ErrNoGroup  = errNoGroup
)

func (l LagInfo) Backlog() int64 { return l.backlog() }

// LagInfo is the full position behind Lag.
func (s *Subscriber) LagInfo(ctx context.Context, topic string) (LagInfo, error) {
	return s.lagInfo(ctx, topic)
}
