package redisbroker

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/spillway-go/spillway"
)

// newClient opens a client for cfg (defaults applied). name is sent as the
// connection's CLIENT SETNAME, which shows in CLIENT LIST and helps find a
// stuck consumer. The returned client releases the embedded server, if any,
// when it is closed.
func newClient(cfg Config, name string) (redis.UniversalClient, error) {
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	addr, release := cfg.Addr, func() {}
	if cfg.Addr == spillway.Embedded {
		addr, release, err = acquireEmbedded()
		if err != nil {
			return nil, err
		}
	}
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		Username:        cfg.Username,
		Password:        string(cfg.Password),
		DB:              cfg.DB,
		TLSConfig:       tc,
		ClientName:      name,
		DisableIdentity: true,
		// Cluster-upgrade notifications are a managed-service feature;
		// keep the connection setup to what every Redis answers.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	return &ownedClient{UniversalClient: c, release: release}, nil
}

// ownedClient runs release once after the client is closed.
type ownedClient struct {
	redis.UniversalClient
	release func()
	once    sync.Once
}

func (c *ownedClient) Close() error {
	err := c.UniversalClient.Close()
	c.once.Do(c.release)
	return err
}

// entryRef is where a message came from. The subscriber's client stores it
// in each entry's field map under entryRefKey, after the read and before
// upstream hands the map to the unmarshaller, which is the only place that
// sees the map but not the entry ID.
type entryRef struct {
	stream, id, consumer string
}

// entryRefKey cannot be forged by a producer: the value under it is always
// replaced with an entryRef, which no Redis reply can contain.
const entryRefKey = "\x00spillway.entry"

// entryClient is the client one upstream subscriber (one consumer name) is
// given. It sees every entry upstream is handed and settles: XREADGROUP and
// XCLAIM (the two reads upstream delivers from) and XACK. It annotates the
// entries read with where they came from, and tells the keep-alive which
// entries this consumer holds.
type entryClient struct {
	redis.UniversalClient
	consumer  string
	keepAlive *keepAlive
	acks      *ackTable
}

func (c *entryClient) XReadGroup(ctx context.Context, a *redis.XReadGroupArgs) *redis.XStreamSliceCmd {
	cmd := c.UniversalClient.XReadGroup(ctx, a)
	if cmd.Err() == nil {
		streams := cmd.Val()
		for i := range streams {
			c.delivered(ctx, streams[i].Stream, a.Consumer, streams[i].Messages)
		}
	}
	return cmd
}

func (c *entryClient) XClaim(ctx context.Context, a *redis.XClaimArgs) *redis.XMessageSliceCmd {
	cmd := c.UniversalClient.XClaim(ctx, a)
	if cmd.Err() == nil {
		c.delivered(ctx, a.Stream, a.Consumer, cmd.Val())
	}
	return cmd
}

func (c *entryClient) XAck(ctx context.Context, stream, group string, ids ...string) *redis.IntCmd {
	cmd := c.UniversalClient.XAck(ctx, stream, group, ids...)
	if cmd.Err() == nil {
		c.keepAlive.forget(subscriptionOf(ctx), stream, c.consumer, ids...)
		c.acks.xacked(stream, c.consumer, ids)
	}
	return cmd
}

func (c *entryClient) delivered(ctx context.Context, stream, consumer string, msgs []redis.XMessage) {
	if len(msgs) == 0 {
		return
	}
	ids := make([]string, len(msgs))
	for i := range msgs {
		if msgs[i].Values == nil {
			msgs[i].Values = make(map[string]any, 1)
		}
		msgs[i].Values[entryRefKey] = entryRef{stream: stream, id: msgs[i].ID, consumer: consumer}
		ids[i] = msgs[i].ID
	}
	c.keepAlive.track(subscriptionOf(ctx), stream, consumer, ids...)
}
