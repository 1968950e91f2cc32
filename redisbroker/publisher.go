package redisbroker

import (
	"maps"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Publisher publishes messages as stream entries (XADD), one round trip per
// message, trimming each stream to about its MAXLEN when one is configured.
// It is watermill-redisstream's publisher on a client of its own. It is safe
// for concurrent use.
type Publisher struct {
	up *redisstream.Publisher

	mu     sync.RWMutex // Publish holds it shared, Close exclusively
	closed bool
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher connects lazily to cfg.Addr (the first Publish dials), or
// uses the client given with [WithClient]. Only the connection fields,
// MaxLen and DefaultMaxLen of cfg are used.
func NewPublisher(cfg Config, logger watermill.LoggerAdapter, opts ...Option) (*Publisher, error) {
	cfg.setDefaults()
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := o.validate(cfg, false); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	client, err := o.newClient(cfg, "spillway-pub")
	if err != nil {
		return nil, err
	}
	up, err := redisstream.NewPublisher(redisstream.PublisherConfig{
		Client:        client, // upstream closes it in Close
		Maxlens:       maps.Clone(cfg.MaxLen),
		DefaultMaxlen: cfg.DefaultMaxLen,
	}, logger)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &Publisher{up: up}, nil
}

// Publish appends msgs to the stream named topic, in order, and returns the
// first error; messages before it were published. Each XADD uses the
// message's context.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errClosed
	}
	return p.up.Publish(topic, msgs...)
}

// Close waits for Publish calls in progress, then closes the publisher and
// its client (not a client given with [WithClient]). Later calls to Publish return an error matching [spillway.ErrClosed]. It is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.up.Close()
}
