package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/spillway-go/spillway"
)

// newClient opens a client for cfg (defaults applied). name is sent as the
// connection's CLIENT SETNAME, which shows in CLIENT LIST and helps find a
// stuck consumer. The returned client releases the embedded server, if any,
// when it is closed.
func newClient(cfg Config, name string, tweaks ...func(*redis.Options)) (redis.UniversalClient, error) {
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
	ro := &redis.Options{
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
	}
	for _, tweak := range tweaks {
		tweak(ro)
	}
	return &ownedClient{UniversalClient: redis.NewClient(ro), release: release}, nil
}

// ErrUnreachable is wrapped, with the cause, by the error of [Ping] when
// Redis does not answer.
var ErrUnreachable = errors.New("cannot reach Redis")

// Ping checks that Redis answers: one PING to cfg.Addr, on a client of its
// own that it closes, or through the client given with [WithClient]
// (left open). Its own client does not retry the command (a refused
// connection fails in under a second); bound the wait with ctx. It
// returns an error wrapping [ErrUnreachable] and the cause (a dial error,
// ctx's deadline…) when Redis does not answer, or a [*spillway.FieldError]
// for a connection field Validate rejects. Call it at start-up to report
// a wrong address or a server that is down at once, instead of on the
// first Publish or read.
func Ping(ctx context.Context, cfg Config, opts ...Option) error {
	cfg.setDefaults()
	o, err := buildOptions(opts)
	if err != nil {
		return err
	}
	if err := o.validate(cfg, false); err != nil {
		return err
	}
	c := o.client
	if c == nil {
		own, err := newClient(cfg, "spillway-ping", func(ro *redis.Options) { ro.MaxRetries = -1 })
		if err != nil {
			return err
		}
		defer func() { _ = own.Close() }()
		c = own
	}
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return nil
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
	deliveries           int64 // Redis's delivery count of the entry, this delivery included
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
	acker     *acker
	window    *handWindow // nil without a window
	// held reports whether the subscriber still holds an entry (see
	// Subscriber.holds); the claim loop never sees those.
	held func(stream, id string) bool

	mu      sync.Mutex
	counted map[string]int64 // stream + "\x00" + ID → delivery count, from the claim loop's last XPENDING
}

func (c *entryClient) XReadGroup(ctx context.Context, a *redis.XReadGroupArgs) *redis.XStreamSliceCmd {
	sent := time.Now()
	cmd := c.UniversalClient.XReadGroup(ctx, a)
	if cmd.Err() == nil {
		streams := cmd.Val()
		for i := range streams {
			// Upstream reads with ">": entries never delivered before.
			c.delivered(ctx, sent, streams[i].Stream, a.Consumer, streams[i].Messages, func(string) int64 { return 1 })
		}
	}
	return cmd
}

// XPendingExt is how upstream's claim loop finds idle entries, just before
// it claims them one by one. Entries the subscriber still holds are left
// out of the reply, so it never claims them: it would run again here what
// it is running or has finished with the ack not yet in Redis (an outage
// longer than MaxIdleTime). The delivery counts of the others are kept for
// XClaim.
func (c *entryClient) XPendingExt(ctx context.Context, a *redis.XPendingExtArgs) *redis.XPendingExtCmd {
	cmd := c.UniversalClient.XPendingExt(ctx, a)
	if cmd.Err() == nil {
		all := cmd.Val()
		idle := make([]redis.XPendingExt, 0, len(all))
		c.mu.Lock()
		c.counted = make(map[string]int64, len(all))
		for _, p := range all {
			if c.held != nil && c.held(a.Stream, p.ID) {
				continue
			}
			idle = append(idle, p)
			c.counted[a.Stream+"\x00"+p.ID] = p.RetryCount
		}
		c.mu.Unlock()
		cmd.SetVal(idle)
	}
	return cmd
}

func (c *entryClient) XClaim(ctx context.Context, a *redis.XClaimArgs) *redis.XMessageSliceCmd {
	sent := time.Now()
	cmd := c.UniversalClient.XClaim(ctx, a)
	if cmd.Err() == nil {
		c.delivered(ctx, sent, a.Stream, a.Consumer, cmd.Val(), func(id string) int64 {
			c.mu.Lock()
			n, ok := c.counted[a.Stream+"\x00"+id]
			delete(c.counted, a.Stream+"\x00"+id)
			c.mu.Unlock()
			// XCLAIM counted one more delivery. A claimed entry was
			// delivered before, whatever the count says.
			if !ok {
				return 2
			}
			return max(n+1, 2)
		})
	}
	return cmd
}

// XAck queues the entries for the subscriber's acker and returns at once,
// so the consumer hands over its next message without waiting for the
// round trip. The acker acknowledges entries this consumer still owns and
// whose ack may reach Redis (see revState): never over a peer's claim,
// never for a message that stepped aside after its entry was revoked.
// Entries it skips stay pending, for their owner or the idle claim.
func (c *entryClient) XAck(ctx context.Context, stream, _ string, ids ...string) *redis.IntCmd {
	n := len(ids)
	if c.window != nil {
		// The window acks upstream's message at handover and holds the
		// entry until its own copy is settled.
		ids = c.window.unreleased(stream, c.consumer, ids)
	}
	if len(ids) > 0 {
		c.acker.enqueue(subscriptionOf(ctx), stream, c.consumer, ids...)
	}
	cmd := redis.NewIntCmd(ctx)
	cmd.SetVal(int64(n))
	return cmd
}

// delivered annotates and tracks msgs, delivered to consumer by a read or
// claim sent at sent.
func (c *entryClient) delivered(ctx context.Context, sent time.Time, stream, consumer string, msgs []redis.XMessage, count func(id string) int64) {
	if len(msgs) == 0 {
		return
	}
	ids := make([]string, len(msgs))
	for i := range msgs {
		if msgs[i].Values == nil {
			msgs[i].Values = make(map[string]any, 1)
		}
		msgs[i].Values[entryRefKey] = entryRef{stream: stream, id: msgs[i].ID, consumer: consumer, deliveries: count(msgs[i].ID)}
		ids[i] = msgs[i].ID
	}
	c.keepAlive.trackSent(sent, subscriptionOf(ctx), stream, consumer, ids...)
}

// ackScript acknowledges entries of stream KEYS[1] in group ARGV[1] that
// are still pending for the consumer they were delivered to, atomically:
// an entry a peer has claimed is left to it. ARGV[2:] are consumer/ID
// pairs. Returns how many were acknowledged.
var ackScript = redis.NewScript(ackScriptSource)

// ackScriptSource is ackScript's Lua. Load it through a pipeline with
// ScriptLoad(ackScriptSource), never ackScript.Load: that stores the
// command's value as the script's hash before the pipeline has run, an
// empty hash, and every ack would then fall back from EVALSHA to EVAL.
const ackScriptSource = `
local n = 0
for i = 2, #ARGV, 2 do
  local consumer, id = ARGV[i], ARGV[i + 1]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if #p > 0 and p[1][2] == consumer then
    n = n + redis.call('XACK', KEYS[1], ARGV[1], id)
  end
end
return n
`

// ackOwned acknowledges ids for consumer with ackScript, leaving out those
// the keep-alive says must not be acknowledged.
func ackOwned(ctx context.Context, c redis.UniversalClient, k *keepAlive, stream, group, consumer string, ids []string) *redis.IntCmd {
	args := make([]any, 0, 2*len(ids)+1)
	args = append(args, group)
	for _, id := range ids {
		if k.mayAck(kaKey{stream: stream, id: id, consumer: consumer}) {
			args = append(args, consumer, id)
		}
	}
	cmd := redis.NewIntCmd(ctx)
	if len(args) == 1 {
		cmd.SetVal(0)
		return cmd
	}
	res, err := ackScript.Run(ctx, c, []string{stream}, args...).Int64()
	if err != nil {
		cmd.SetErr(err)
	} else {
		cmd.SetVal(res)
	}
	return cmd
}
