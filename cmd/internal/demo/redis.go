package demo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-go/spillway/cmd/internal/redisproc"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/router"
)

// ErrNoRedisServer is returned for broker redis when redis-server is not
// installed. The embedded miniredis cannot stand in: it does not age
// pending entries, so the idle-claim redelivery the demo is about never
// happens on it.
var ErrNoRedisServer = errors.New("demo: --broker redis needs redis-server on PATH (apt-get install redis-server): " +
	"the embedded miniredis does not age pending entries, so the redelivery this demo shows cannot happen on it")

// redisEnv is a real redis-server on a free loopback port, in a temporary
// directory, without persistence.
type redisEnv struct {
	o    Options
	srv  *redisproc.Server
	addr string
	pub  *redisstream.Publisher
	// client is srv's client.
	client *redis.Client
}

func newRedisEnv(o Options) (*redisEnv, error) {
	srv, err := redisproc.Start("spillway-demo-redis-")
	if errors.Is(err, redisproc.ErrNotFound) {
		return nil, ErrNoRedisServer
	}
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	e := &redisEnv{o: o, srv: srv, addr: srv.Addr, client: srv.Client}
	e.pub, err = redisstream.NewPublisher(redisstream.PublisherConfig{Client: redis.NewClient(&redis.Options{Addr: e.addr})}, nil)
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *redisEnv) publisher() message.Publisher { return e.pub }

// naiveSubscriber is watermill-redisstream with its defaults, given the
// same redelivery deadline (MaxIdleTime) and claim interval as Spillway's.
func (e *redisEnv) naiveSubscriber(m *member, topic string) (message.Subscriber, error) {
	return redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        redis.NewClient(&redis.Options{Addr: e.addr}),
		ConsumerGroup: GroupNaive + "." + topic,
		Consumer:      m.name,
		MaxIdleTime:   e.o.Deadline,
		ClaimInterval: e.o.Deadline / 4,
		// Only so that Close returns: upstream's first read otherwise
		// blocks forever.
		DisableIndefiniteInitialBlock: true,
	}, m.logger)
}

func (e *redisEnv) spillwayConfig(cfg *router.Config, m *member) {
	cfg.Broker = "redis"
	r := &cfg.Redis
	r.Addr = e.addr
	r.ConsumerGroup = GroupSpillway
	r.Consumer = m.name // unique per member: both run in this process
	r.MaxIdleTime = e.o.Deadline
	r.ClaimInterval = e.o.Deadline / 4
	r.BlockTime = 100 * time.Millisecond
}

func (e *redisEnv) routerOptions(*member) []router.Option { return nil }

func (e *redisEnv) lag(group string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), lagTimeout)
	defer cancel()
	spillway := isSpillway(group)
	if group == GroupSingleLane {
		group = GroupSpillway // the consumer group prefix of both lane runs
	}
	var total int64
	for _, t := range []string{TopicPositions, TopicBoundaries} {
		streams := map[string]string{t: group + "." + t}
		if spillway {
			// the router names the retry handler of handler t "<t>.retry"
			streams[retrygate.Config{}.RetryTopicFor(t)] = group + "." + t + ".retry"
		}
		for stream, g := range streams {
			groups, err := e.client.XInfoGroups(ctx, stream).Result()
			if err != nil {
				continue // not created yet
			}
			for _, gi := range groups {
				if gi.Name == g { // undelivered (-1: unknown) plus pending
					total += max(gi.Lag, 0) + gi.Pending
				}
			}
		}
	}
	return total, nil
}

func (e *redisEnv) sessions() bool { return false }

func (e *redisEnv) close() {
	if e.pub != nil {
		_ = e.pub.Close()
	}
	e.srv.Close()
}
