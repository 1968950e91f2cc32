package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// recoverPageSize is the XPENDING page used when a restarted consumer looks
// for the entries its previous incarnation left pending.
const recoverPageSize = 500

// Subscriber reads a consumer group's streams through several consumers at
// once and hands their messages to one channel per topic.
//
// Each of the Config.Consumers consumers is a watermill-redisstream
// subscriber with its own client and its own, stable consumer name. One such
// subscription delivers one message at a time and waits for its ack, so a
// Subscriber holds at most Consumers unacked messages per topic: that is the
// concurrency a vertex budget downstream governs. With Config.Window above
// 1 each consumer hands over up to Window messages before the first is
// settled, so light messages pass heavy ones waiting for budget on the
// same stream (docs/redis.md, "The window").
//
// On top of upstream the Subscriber adds:
//   - entry identity: every message carries its stream, entry ID, group and
//     consumer in metadata (keys a producer cannot forge), which is what the
//     keep-alive and the dead-letter middleware need;
//   - poison safety: an entry that cannot be unmarshalled becomes a message
//     flagged malformed ([IsMalformed]) instead of ending the subscription; route
//     it with [DeadLetter];
//   - restart recovery: on the first Subscribe to a topic, entries still
//     pending for this subscriber's consumer names (left by its previous
//     incarnation) are made claimable at once instead of after MaxIdleTime;
//   - group recovery: if the group disappears (a server restarted without
//     persistence) it is created again and reading resumes;
//   - the group's lag on a topic ([Subscriber.Lag]) and the topics
//     subscribed so far ([Subscriber.Topics]), which is what a lag sampler
//     (telemetry/redistel) reads.
//
// A Subscriber is safe for concurrent use. Close stops every subscription
// and the keep-alive, and closes all clients.
type Subscriber struct {
	cfg     Config
	nacks   bool // nacked messages count as deliveries (not WithoutNackCount)
	logger  watermill.LoggerAdapter
	names   []string
	ups     []*redisstream.Subscriber
	clients []redis.UniversalClient // ups' clients, in order
	control redis.UniversalClient

	keepAlive *keepAlive
	acker     *acker
	window    *handWindow // nil with Config.Window 1
	malformed atomic.Uint64

	mu      sync.Mutex // held through Subscribe, so Close never races it
	topics  map[string]bool
	closed  bool
	closing chan struct{}
	shut    chan struct{}  // closed when the first Close has finished
	wg      sync.WaitGroup // fan-in goroutines
	acks    ackTable       // acks Close waits for
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber creates the consumers of cfg.ConsumerGroup; it connects
// lazily to cfg.Addr, or uses the client given with [WithClient]. It starts
// the keep-alive goroutine. Options: [WithClient], [WithLogger],
// [WithoutNackCount].
func NewSubscriber(cfg Config, opts ...Option) (*Subscriber, error) {
	if cfg.Consumer == "" {
		cfg.Consumer = defaultConsumerName() + "-" + strconv.FormatInt(defaultNamed.Add(1), 10)
	}
	cfg.setDefaults()
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := o.validate(cfg, true); err != nil {
		return nil, err
	}
	logger := o.logger
	s := &Subscriber{
		cfg:     cfg,
		nacks:   !o.noNacks,
		logger:  logger,
		names:   cfg.consumerNames(),
		topics:  make(map[string]bool),
		closing: make(chan struct{}),
		shut:    make(chan struct{}),
	}
	if s.control, err = o.newClient(cfg, "spillway-ctl-"+cfg.Consumer); err != nil {
		return nil, err
	}
	nack := cfg.NackResendSleep
	if nack < 0 {
		nack = redisstream.NoSleep
	}
	upLogger := quietLogger{LoggerAdapter: logger, closing: s.closing}
	s.keepAlive = newKeepAlive(s.control, cfg, logger)
	s.acker = newAcker(s.control, cfg.ConsumerGroup, s.keepAlive, &s.acks, logger)
	if cfg.Window > 1 {
		s.window = newHandWindow()
	}
	for _, name := range s.names {
		c, err := o.newClient(cfg, "spillway-"+name)
		if err != nil {
			s.closeClients()
			return nil, err
		}
		up, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client: &entryClient{UniversalClient: c, consumer: name, keepAlive: s.keepAlive, acker: s.acker, window: s.window, held: s.holds}, // upstream closes it
			Unmarshaller: safeUnmarshaller{
				inner:         redisstream.DefaultMarshallerUnmarshaller{},
				group:         cfg.ConsumerGroup,
				maxDeliveries: cfg.MaxDeliveries,
				malformed:     &s.malformed,
			},
			Consumer:                      name,
			ConsumerGroup:                 cfg.ConsumerGroup,
			NackResendSleep:               nack,
			BlockTime:                     cfg.BlockTime,
			ClaimInterval:                 cfg.ClaimInterval,
			MaxIdleTime:                   cfg.MaxIdleTime,
			OldestId:                      "0",
			ShouldClaimPendingMessage:     func(redis.XPendingExt) bool { return !s.keepAlive.stuck(name) },
			ShouldStopOnReadErrors:        s.onReadError,
			DisableIndefiniteInitialBlock: true,
		}, upLogger)
		if err != nil {
			_ = c.Close()
			s.closeClients()
			return nil, err
		}
		s.ups = append(s.ups, up)
		s.clients = append(s.clients, c)
	}
	return s, nil
}

// closeClients closes what a failed constructor opened.
func (s *Subscriber) closeClients() {
	for _, up := range s.ups {
		_ = up.Close()
	}
	if s.acker != nil {
		_ = s.acker.close()
	}
	if s.keepAlive != nil {
		s.keepAlive.close()
	}
	_ = s.control.Close()
}

// holds reports whether the entry id of stream, delivered to any of this
// subscriber's consumers, is still held here: not yet settled, or acked
// with the ack not yet in Redis.
func (s *Subscriber) holds(stream, id string) bool {
	for _, name := range s.names {
		if s.keepAlive.holds(stream, name, id) {
			return true
		}
	}
	return false
}

// Config returns the configuration in use, with defaults applied.
func (s *Subscriber) Config() Config { return s.cfg }

// consumers returns the consumer names this subscriber reads as.
func (s *Subscriber) consumers() []string { return append([]string(nil), s.names...) }

// Lag reads the group's backlog on topic now, with one XINFO GROUPS
// (Redis 7 or later): the entries not yet delivered to the group plus
// those delivered but not yet acknowledged (in flight, waiting for budget,
// or left by a dead consumer). Undelivered entries count as 0 when Redis
// cannot tell (after XDEL of entries the group has not read). It never
// caches: sample it from one goroutine (telemetry/redistel with a
// telemetry.LagSampler), not per message. It fails when the stream or
// the group does not exist (yet): Subscribe and SubscribeInitialize create
// both.
func (s *Subscriber) Lag(ctx context.Context, topic string) (int64, error) {
	info, err := s.lagInfo(ctx, topic)
	if err != nil {
		return 0, err
	}
	return info.backlog(), nil
}

// lagInfo reads the group's position in topic's stream.
func (s *Subscriber) lagInfo(ctx context.Context, topic string) (lagInfo, error) {
	return readLag(ctx, s.control, topic, s.cfg.ConsumerGroup)
}

// Topics returns the topics subscribed to so far, sorted.
func (s *Subscriber) Topics() []string {
	s.mu.Lock()
	topics := make([]string, 0, len(s.topics))
	for t := range s.topics {
		topics = append(topics, t)
	}
	s.mu.Unlock()
	slices.Sort(topics)
	return topics
}

// SubscriberStats counts what a subscriber and its keep-alive did.
type SubscriberStats struct {
	// Malformed counts entries that could not be unmarshalled and were
	// delivered flagged malformed (a redelivery counts again), for the
	// [DeadLetter] middleware to move to the dead-letter topic.
	Malformed uint64
	// Tracked is the number of entries held by this subscriber right now:
	// delivered to one of its consumers and not yet acked.
	Tracked int
	// Refreshed counts keep-alive refreshes (one per entry per tick).
	Refreshed uint64
	// Lost counts entries found owned by another consumer at refresh: a
	// peer claimed them while this subscriber still held them.
	Lost uint64
	// Expired counts entries the keep-alive let go because their consumer
	// acked nothing for KeepAlive.MaxInFlight, left to be claimed by a peer.
	Expired uint64
	// RefreshErrors counts keep-alive refresh calls that failed (Redis
	// unreachable…).
	RefreshErrors uint64
	// Revoked counts deliveries revoked (see [Subscriber.Revoked]): lost
	// to a peer, expired, given up before a peer could claim it (no
	// refresh got through in time), or held when the group was recreated.
	Revoked uint64
}

// Stats returns counters since the subscriber was created.
func (s *Subscriber) Stats() SubscriberStats {
	ka := s.keepAlive.stats()
	return SubscriberStats{
		Malformed:     s.malformed.Load(),
		Tracked:       ka.Tracked,
		Refreshed:     ka.Refreshed,
		Lost:          ka.Lost,
		Expired:       ka.Expired,
		RefreshErrors: ka.Errors,
		Revoked:       ka.Revoked,
	}
}

// Revoked returns a channel that closes when the delivery of msg is
// revoked: the keep-alive found its entry claimed by a peer, let it go
// after KeepAlive.MaxInFlight, gave it up before a peer could claim it
// (no refresh got through in time), or the consumer group was recreated.
// A revoked entry not yet handed over never is. Use it as
// middleware.WithRevoked's function, so a message still waiting for budget
// steps aside instead of running over a peer's claim; call
// [Subscriber.Completed] when its handler succeeds. Once Revoked was asked
// for a delivery, its ack reaches Redis only if Completed was called for
// it: a message that stepped aside is left pending, for the peer or the
// idle claim, never acknowledged unprocessed. Whether asked or not, an
// ack is never sent for an entry a peer now owns.
//
// Revoked returns nil for a message that is not a delivery of this
// subscriber still unacknowledged, or when the keep-alive is disabled
// (nothing can tell a revocation then). It knows a delivery by the message
// the subscriber handed over, not by its metadata: a message that carries
// a delivery's metadata without being that message (a copy, a forgery, the
// attempt before a nack) gets nil, and Completed does nothing for it.
func (s *Subscriber) Revoked(msg *message.Message) <-chan struct{} {
	return s.keepAlive.watch(msg)
}

// Completed records that the handler of msg succeeded in this delivery
// attempt, so its ack reaches Redis even if the delivery was revoked while
// it ran, provided this consumer still owns the entry. See
// [Subscriber.Revoked].
func (s *Subscriber) Completed(msg *message.Message) {
	s.keepAlive.complete(msg)
}

// SubscribeInitialize creates topic's stream and the consumer group if they
// do not exist. A new group starts at the beginning of the stream.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.createGroup(ctx, topic)
}

func (s *Subscriber) createGroup(ctx context.Context, topic string) error {
	return groupCreated(s.control.XGroupCreateMkStream(ctx, topic, s.cfg.ConsumerGroup, "0").Err(), s.cfg.ConsumerGroup, topic)
}

// groupCreated is the error of creating group on topic: nil when it was
// created or already there.
func groupCreated(err error, group, topic string) error {
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("redisbroker: creating group %q on %q: %w", group, topic, err)
	}
	return nil
}

// Subscribe starts Consumers subscriptions of the group to topic and
// returns one channel carrying all their messages. The channel is closed
// when ctx is done or the subscriber is closed; messages not yet acked then
// stay pending and are redelivered (claimed after MaxIdleTime, or at once by
// this consumer's next incarnation).
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	// The first subscription connects every consumer's client while the
	// group is set up, instead of each consumer after it (connections
	// are opened lazily): on a busy machine each of these round trips is
	// slow, and the router subscribes its handlers one after the other.
	var warmed sync.WaitGroup
	if len(s.topics) == 0 {
		for _, c := range s.clients {
			warmed.Go(func() { _ = c.Ping(ctx).Err() }) // best effort
		}
	}
	if !s.topics[topic] {
		// One round trip: the group, and the ack script, best effort:
		// with the script cached, no ack pays the NOSCRIPT round trip,
		// which widens the window in which Close cancels an ack in
		// flight.
		pipe := s.control.Pipeline()
		group := pipe.XGroupCreateMkStream(ctx, topic, s.cfg.ConsumerGroup, "0")
		pipe.ScriptLoad(ctx, ackScriptSource)
		_, _ = pipe.Exec(ctx) // each command's error is read on its own
		if err := groupCreated(group.Err(), s.cfg.ConsumerGroup, topic); err != nil {
			warmed.Wait()
			return nil, err
		}
		s.recoverOwnPending(ctx, topic)
		s.topics[topic] = true
	}
	warmed.Wait()
	sub := &subscription{}
	subCtx, cancel := context.WithCancel(withSubscription(ctx, sub))
	// Each upstream consumer makes its own round trip to Redis before it
	// reads (it creates the group if missing): started one after the
	// other, 48 consumers held a handler's start back by about 100 ms, and
	// the router subscribes its handlers one after the other too.
	ins := make([]<-chan *message.Message, len(s.ups))
	errs := make([]error, len(s.ups))
	var started sync.WaitGroup
	for i, up := range s.ups {
		started.Go(func() { ins[i], errs[i] = up.Subscribe(subCtx, topic) })
	}
	started.Wait()
	if err := errors.Join(errs...); err != nil {
		cancel() // ends the subscriptions that did start
		s.keepAlive.ended(sub)
		return nil, fmt.Errorf("redisbroker: subscribing to %q: %w", topic, err)
	}

	out := make(chan *message.Message)
	var fwd sync.WaitGroup
	fwd.Add(len(ins))
	for _, in := range ins {
		go s.forward(subCtx, in, out, &fwd)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-s.closing:
			cancel() // message contexts end as soon as Close starts
		case <-subCtx.Done():
		}
		fwd.Wait()
		cancel()
		close(out)
		// Nobody here will process what this subscription still holds.
		s.keepAlive.ended(sub)
	}()
	return out, nil
}

// forward moves messages from one consumer to the shared channel. Upstream
// sends the next message of a consumer only after the previous one is
// acked or nacked, so this adds no buffering. A message that cannot be
// handed over because the subscription is ending is dropped unacked: it
// stays pending.
//
// Upstream redelivers a nacked message as msg.Copy(), which has no context:
// it would never see the subscription end, and a handler waiting on it (for
// budget, say) would hold up shutdown. Such a message gets a context that
// ends with the subscription, or when the consumer's next message arrives
// (which upstream sends only once this one is settled).
//
// Upstream resends such a copy without XCLAIM, so Redis's delivery count
// does not rise: forward counts it instead, one more delivery per copy of
// the entry it handed over last, so that a message that keeps failing
// reaches Config.MaxDeliveries and is dead-lettered. The count lives only
// as long as the consumer holds the entry. A message never handed over is
// never nacked, so it produces no copy and no count. With
// [WithoutNackCount] it counts nothing.
func (s *Subscriber) forward(ctx context.Context, in <-chan *message.Message, out chan<- *message.Message, wg *sync.WaitGroup) {
	defer wg.Done()
	if s.window != nil {
		s.forwardWindow(ctx, in, out)
		return
	}
	var settled context.CancelFunc // ends the previous copy's context
	defer func() {
		if settled != nil {
			settled()
		}
	}()
	var last entry      // the entry handed over last
	var delivered int64 // its deliveries so far, nacked ones included
	for msg := range in {
		if settled != nil {
			settled()
			settled = nil
		}
		resent := msg.Context().Done() == nil // a copy made after a nack
		if resent {
			mctx, cancel := context.WithCancel(ctx)
			msg.SetContext(mctx)
			settled = cancel
		}
		// Recorded before the handover: the XACK can follow the Ack
		// before this goroutine runs again. A message never handed over is
		// never acked, and Close does not wait for it.
		e, isEntry := entryOf(msg)
		key := kaKey{stream: e.Stream, id: e.ID, consumer: e.Consumer}
		if isEntry {
			if !s.keepAlive.handover(key, msg) {
				// Revoked, or its claim lapsed while it waited here (read
				// ahead, or resent after a nack): a peer may be running it
				// already. It is not started; the ack lets upstream go on
				// and is never sent to Redis, so the entry stays pending
				// for whoever claims it.
				msg.Ack()
				continue
			}
			if resent && e == last && s.nacks {
				delivered++
				setDeliveries(msg, delivered, s.cfg.MaxDeliveries)
			} else {
				last, delivered = e, int64(max(Deliveries(msg), 1))
			}
			s.acks.handed(msg, e)
		}
		select {
		case out <- msg:
			continue
		case <-s.closing:
		case <-ctx.Done():
		}
		if isEntry {
			s.keepAlive.withdraw(key, msg) // it never reached a handler
		}
	}
}

// recoverOwnPending makes the entries pending for this subscriber's consumer
// names claimable now. They were delivered to a previous incarnation of this
// process (this Subscriber has delivered nothing on topic yet), which is
// gone; without this they would wait out MaxIdleTime. XCLAIM to the same
// consumer with IDLE set past MaxIdleTime and JUSTID changes neither the
// owner nor the delivery count; upstream's first claim pass, which runs as
// the subscription starts, then picks them up. Best effort: errors are
// logged and leave the entries to the normal idle claim.
func (s *Subscriber) recoverOwnPending(ctx context.Context, topic string) {
	idle := strconv.FormatInt((2 * s.cfg.MaxIdleTime).Milliseconds(), 10)
	total := 0
	// One round trip asks for every consumer's page (and one claims what
	// they hold), not one per consumer: the router subscribes its handlers
	// one after the other, and with 48 consumers, on a Redis busy serving
	// the handlers already running, those round trips one by one held each
	// later handler's start back by a few hundred milliseconds.
	starts := make(map[string]string, len(s.names))
	for _, name := range s.names {
		starts[name] = "-"
	}
	for len(starts) > 0 {
		names := make([]string, 0, len(starts))
		for _, name := range s.names {
			if _, ok := starts[name]; ok {
				names = append(names, name)
			}
		}
		pipe := s.control.Pipeline()
		cmds := make([]*redis.XPendingExtCmd, len(names))
		for i, name := range names {
			cmds[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{
				Stream: topic, Group: s.cfg.ConsumerGroup, Start: starts[name], End: "+", Count: recoverPageSize, Consumer: name,
			})
		}
		_, _ = pipe.Exec(ctx) // each command's error is read below
		claim := s.control.Pipeline()
		var (
			claims  []*redis.Cmd
			claimed []string
			counts  []int
		)
		for i, name := range names {
			pending, err := cmds[i].Result()
			if err != nil {
				s.logger.Error("Looking for own pending entries failed", err, watermill.LogFields{"topic": topic, "consumer": name})
				delete(starts, name)
				continue
			}
			if len(pending) == 0 {
				delete(starts, name)
				continue
			}
			args := make([]any, 0, len(pending)+8)
			args = append(args, "XCLAIM", topic, s.cfg.ConsumerGroup, name, 0)
			for _, p := range pending {
				args = append(args, p.ID)
			}
			args = append(args, "IDLE", idle, "JUSTID")
			claims = append(claims, claim.Do(ctx, args...))
			claimed = append(claimed, name)
			counts = append(counts, len(pending))
			if len(pending) < recoverPageSize {
				delete(starts, name)
			} else {
				starts[name] = "(" + pending[len(pending)-1].ID
			}
		}
		if len(claims) == 0 {
			continue
		}
		_, _ = claim.Exec(ctx)
		for i, c := range claims {
			if err := c.Err(); err != nil {
				s.logger.Error("Recovering own pending entries failed", err, watermill.LogFields{"topic": topic, "consumer": claimed[i]})
				delete(starts, claimed[i])
				continue
			}
			total += counts[i]
		}
	}
	if total > 0 {
		s.logger.Info("Recovered entries left pending by a previous run", watermill.LogFields{"topic": topic, "entries": total})
	}
}

// onReadError is upstream's ShouldStopOnReadErrors: stop reading at once
// when closing, recreate the group if it vanished, keep going otherwise
// (upstream then retries after 500 ms; go-redis reconnects).
func (s *Subscriber) onReadError(err error) bool {
	select {
	case <-s.closing:
		return true
	default:
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed) {
		return true
	}
	if strings.HasPrefix(err.Error(), "NOGROUP") {
		s.recreateGroups()
	}
	return false
}

// recreateGroups creates the group again on every subscribed topic, after a
// server lost it (restarted without persistence, or FLUSHALL). Entries
// published before the loss are gone with it; reading resumes with new ones.
func (s *Subscriber) recreateGroups() {
	s.mu.Lock()
	topics := make([]string, 0, len(s.topics))
	for t := range s.topics {
		topics = append(topics, t)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, t := range topics {
		// Every entry held on t was pending in the lost group: nobody
		// owns it any more, so waiting messages step aside.
		s.keepAlive.revokeStream(t)
		if err := s.createGroup(ctx, t); err != nil {
			select {
			case <-s.closing:
				// Close shut the client under us: not a failure.
				return
			default:
			}
			s.logger.Error("Recreating the consumer group failed", err, watermill.LogFields{"topic": t})
			continue
		}
		s.logger.Info("Consumer group was missing; created it again", watermill.LogFields{"topic": t, "group": s.cfg.ConsumerGroup})
	}
}

// Close ends every subscription, stops the keep-alive, and closes all clients (not a client given with
// [WithClient]). It is idempotent: a later or concurrent call waits until
// the first has finished (a Watermill router closes its subscribers when
// it closes, and may still be doing so when its owner closes them too) and
// returns nil. Subscribe then fails with an error matching
// [spillway.ErrClosed]. Every message acked before Close is acknowledged
// in Redis (XACK) before Close returns, even when the subscription's
// context ended first. Entries read but never handed over, and those whose
// message was nacked, are made claimable by peers at once (their idle time
// set past MaxIdleTime; those never handed over get their delivery back).
// A message still out with a handler stays pending: a peer claims it after
// MaxIdleTime.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.shut
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	defer close(s.shut)

	errs := make([]error, len(s.ups))
	var wg sync.WaitGroup
	for i, up := range s.ups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = up.Close()
		}()
	}
	wg.Wait()
	s.wg.Wait()
	if s.window != nil {
		s.window.flushAcked(s.acker)
	}
	// Upstream has stopped: nothing is queued for the acker any more.
	if err := s.acker.close(); err != nil {
		errs = append(errs, fmt.Errorf("redisbroker: acknowledging acked messages on close: %w", err))
	}
	if err := s.acks.settle(s.control, s.keepAlive, s.cfg.ConsumerGroup, 5*time.Second); err != nil {
		errs = append(errs, fmt.Errorf("redisbroker: acknowledging acked messages on close: %w", err))
	}
	// What this subscriber read and will not run: peers may take it now.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	s.keepAlive.releaseLeft(ctx)
	cancel()
	s.keepAlive.close()
	errs = append(errs, s.control.Close())
	return errors.Join(errs...)
}

// quietLogger is the logger upstream gets: errors that only say the
// subscriber is shutting down are logged at debug level.
type quietLogger struct {
	watermill.LoggerAdapter
	closing <-chan struct{}
}

func (l quietLogger) Error(msg string, err error, fields watermill.LogFields) {
	shuttingDown := errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed)
	if !shuttingDown {
		select {
		case <-l.closing:
			shuttingDown = true
		default:
		}
	}
	if shuttingDown {
		l.LoggerAdapter.Debug(msg, fields.Add(watermill.LogFields{"err": fmt.Sprint(err)}))
		return
	}
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l quietLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return quietLogger{LoggerAdapter: l.LoggerAdapter.With(fields), closing: l.closing}
}
