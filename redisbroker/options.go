package redisbroker

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
)

// Option customises what [NewPublisher], [NewSubscriber], [NewDeadLetter]
// and [Ping] build with code rather than configuration. Each says which
// constructors it applies to; the others ignore it.
type Option func(*options)

type options struct {
	client    redis.UniversalClient
	clientSet bool
	noNacks   bool // WithoutNackCount
	logger    watermill.LoggerAdapter
	publisher message.Publisher // WithPublisher
}

// WithLogger makes a publisher, subscriber or dead-letter middleware log
// to logger. Without it (or with nil) they log nothing. Ping ignores it.
func WithLogger(logger watermill.LoggerAdapter) Option {
	return func(o *options) { o.logger = logger }
}

// WithPublisher gives [NewDeadLetter] the publisher it writes dead
// letters with (required there). A publisher of [NewPublisher] writes
// them as a stream next to the others. The other constructors ignore it.
func WithPublisher(p message.Publisher) Option {
	return func(o *options) { o.publisher = p }
}

// WithClient makes a publisher or subscriber send every command through
// client instead of dialling Config.Addr: a Cluster or Sentinel
// (failover) client, or a pool the program already has. The connection
// fields of Config (Addr, Username, Password, DB, TLS) are then ignored and
// need not be set. Close leaves client open; the caller closes it after
// the publishers and subscribers that use it.
//
// A subscriber keeps Config.Consumers blocking reads (XREADGROUP, up to
// BlockTime each) in flight per subscribed topic, plus its keep-alive and
// lag reads, on client's pool: size the pool (PoolSize) above Consumers ×
// topics, or reads wait for a free connection. A nil client makes the
// constructor fail.
func WithClient(client redis.UniversalClient) Option {
	return func(o *options) { o.client, o.clientSet = client, true }
}

// WithoutNackCount makes a subscriber leave nacked messages out of the
// delivery count ([Deliveries], Config.MaxDeliveries): only Redis's own
// deliveries count, the first read and every claim. Use it when a
// middleware of yours retries failures and dead-letters them itself, and
// nacks messages it has not run (spillway's retry gate with defer: nack
// does, and the router sets this option unless retry.disabled):
// counting those nacks would dead-letter work the middleware meant to run
// later. Publishers ignore it.
func WithoutNackCount() Option {
	return func(o *options) { o.noNacks = true }
}

func buildOptions(opts []Option) (options, error) {
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.clientSet && o.client == nil {
		return o, &spillway.FieldError{Field: "WithClient", Value: "nil", Reason: "needs a client"}
	}
	if o.logger == nil {
		o.logger = watermill.NopLogger{}
	}
	return o, nil
}

// validate checks cfg for a publisher (sub false) or a subscriber; with a
// client of the caller's, the connection fields are not checked.
func (o options) validate(cfg Config, sub bool) error {
	if o.client == nil {
		if err := cfg.validateDial(); err != nil {
			return err
		}
	}
	if err := cfg.validateStreams(); err != nil {
		return err
	}
	if sub {
		return cfg.validateSubscriber()
	}
	return nil
}

// newClient returns the caller's client, wrapped so that closing it (as
// upstream's Close does) leaves it open, or a new client of cfg named name.
func (o options) newClient(cfg Config, name string) (redis.UniversalClient, error) {
	if o.client != nil {
		return borrowedClient{o.client}, nil
	}
	return newClient(cfg, name)
}

// borrowedClient is a client the caller owns: Close does nothing.
type borrowedClient struct{ redis.UniversalClient }

func (borrowedClient) Close() error { return nil }
