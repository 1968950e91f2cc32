package redisbroker

import (
	"maps"
	"sync"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
)

// publisher is what [NewPublisher] returns: watermill-redisstream's
// publisher, with a Close that waits for Publish calls in progress.
type publisher struct {
	up *redisstream.Publisher

	mu     sync.RWMutex // Publish holds it shared, Close exclusively
	closed bool
}

var _ message.Publisher = (*publisher)(nil)

// NewPublisher returns a publisher that writes messages as stream entries
// (XADD), one round trip per message, trimming each stream to about its
// MAXLEN when one is configured: watermill-redisstream's publisher on a
// client of its own. It connects lazily to cfg.Addr (the first Publish
// dials), or uses the client given with [WithClient]. Only the connection
// fields, MaxLen and DefaultMaxLen of cfg are used. Options: [WithClient],
// [WithLogger].
//
// Publish appends the messages to the stream named topic, in order, and
// returns the first error (messages before it were published); each XADD
// uses the message's context. Close waits for Publish calls in progress,
// then closes the publisher and its client (not a client given with
// WithClient); Publish then returns an error matching [spillway.ErrClosed].
// Close is idempotent. The publisher is safe for concurrent use.
func NewPublisher(cfg Config, opts ...Option) (message.Publisher, error) {
	cfg.setDefaults()
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := o.validate(cfg, false); err != nil {
		return nil, err
	}
	client, err := o.newClient(cfg, "spillway-pub")
	if err != nil {
		return nil, err
	}
	up, err := redisstream.NewPublisher(redisstream.PublisherConfig{
		Client:        client, // upstream closes it in Close
		Maxlens:       maps.Clone(cfg.MaxLen),
		DefaultMaxlen: cfg.DefaultMaxLen,
	}, o.logger)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &publisher{up: up}, nil
}

// Publish appends msgs to the stream named topic (see [NewPublisher]).
func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errClosed
	}
	return p.up.Publish(topic, msgs...)
}

// Close closes the publisher (see [NewPublisher]).
func (p *publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.up.Close()
}
