package redisbroker

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// refreshScript re-claims pending entries for the consumer that already owns
// them, which resets their idle time without touching their delivery count
// (XCLAIM … JUSTID). The ownership check and the claim run atomically, so an
// entry a peer has claimed in the meantime is never taken back: XCLAIM with
// min-idle 0 alone would steal it. KEYS[1] is the stream, ARGV[1] the group,
// then consumer/ID pairs. Returns two lists of IDs: those now owned by
// another consumer, and those no longer pending at all (acked, or trimmed
// and dropped), which need nothing more.
var refreshScript = redis.NewScript(`
local taken, gone = {}, {}
for i = 2, #ARGV, 2 do
  local consumer, id = ARGV[i], ARGV[i + 1]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if #p == 0 then
    gone[#gone + 1] = id
  elseif p[1][2] == consumer then
    redis.call('XCLAIM', KEYS[1], ARGV[1], consumer, 0, id, 'JUSTID')
  else
    taken[#taken + 1] = id
  end
end
return {taken, gone}
`)

// reclaimScript re-claims entries for the consumer that owns them
// (XCLAIM to that same consumer with IDLE, RETRYCOUNT and JUSTID), leaving
// the owner as it is, for two purposes:
//   - giving back the delivery Redis counted for entries a consumer let go
//     without ever handing them to a handler (read-ahead queued behind a
//     stuck one, or left by a closing subscriber): the delivery count is
//     lowered by one, so it says how many times a handler got the entry;
//   - releasing what a closing subscriber leaves: IDLE past MaxIdleTime,
//     so a peer's next claim pass takes it instead of waiting that long.
//
// KEYS[1] is the stream, ARGV[1] the group, ARGV[2] the idle time to set
// in milliseconds ("" keeps each entry's own), then consumer/ID/giveBack
// triples (giveBack "1" lowers the count). Entries no longer pending for
// that consumer are left alone.
var reclaimScript = redis.NewScript(`
for i = 3, #ARGV, 3 do
  local consumer, id, back = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if #p > 0 and p[1][2] == consumer then
    local count, idle = p[1][4], ARGV[2]
    if back == "1" and count > 0 then count = count - 1 end
    if idle == "" then idle = p[1][3] end
    redis.call('XCLAIM', KEYS[1], ARGV[1], consumer, 0, id, 'IDLE', idle, 'RETRYCOUNT', count, 'JUSTID')
  end
end
return 0
`)

// refreshBatch bounds the entries refreshed by one script call, so one call
// never holds the server for long.
const refreshBatch = 256

type kaKey struct{ stream, id, consumer string }

// kaEntry is one entry kept alive.
type kaEntry struct {
	sub *subscription // the subscription it was delivered to
	// refreshed is when the read or claim that delivered the entry, or
	// its last successful refresh, was sent. Redis reset the entry's idle
	// clock at some moment after that, so a peer can claim the entry no
	// sooner than refreshed + MaxIdleTime.
	refreshed time.Time
}

// revState is the revocation state of one delivered entry, from its
// delivery to its XACK (or the end of its subscription).
//
// An entry is revoked when this subscriber can no longer be sure it owns
// it: a peer claimed it, the keep-alive let it go (MaxInFlight), its claim
// was about to lapse (no refresh got through in time), or the group was
// recreated. Revocation closes the channel [Subscriber.Revoked] returned
// for it, so a message waiting for budget steps aside, and a revoked entry
// not yet handed over never is (keepAlive.handover). The ack of a revoked
// entry is sent to Redis only for a message whose handler completed in
// this attempt ([Subscriber.Completed]) or that nobody watched for
// revocation, and only while this consumer still owns the entry (see
// ackScript).
type revState struct {
	ch        chan struct{} // made by Revoked; closed on revocation
	revoked   bool
	watched   bool // Revoked was asked for the current attempt
	completed bool // Completed was called in the current attempt
	// msg is the message of the current attempt, from its handover
	// (attempt) on: keepAlive.handed finds this record by it.
	msg *message.Message
}

// kaTracked holds the two records track makes for an entry, which live in
// two maps (an entry can stop being kept alive long before it is acked).
type kaTracked struct {
	kaEntry
	revState
}

// subscription identifies one Subscribe call. Upstream passes a context
// derived from the subscription's to every read, claim and ack, so the
// client can tell which subscription an entry was delivered to. Its fields
// are guarded by keepAlive.mu.
type subscription struct {
	ended bool
}

type subscriptionKey struct{}

func withSubscription(ctx context.Context, sub *subscription) context.Context {
	return context.WithValue(ctx, subscriptionKey{}, sub)
}

func subscriptionOf(ctx context.Context) *subscription {
	sub, _ := ctx.Value(subscriptionKey{}).(*subscription)
	return sub
}

// kaPipe is one upstream loop: one consumer reading one stream for one
// subscription. It hands over one message at a time, so it is the unit that
// makes progress or gets stuck.
type kaPipe struct {
	sub      *subscription
	stream   string
	consumer string
}

type kaPipeState struct {
	held       int       // entries tracked for this pipe
	progressAt time.Time // last ack, or when it went from holding nothing to holding something
	stuck      bool      // no ack for MaxInFlight; cleared by the next ack
}

// keepAlive keeps the pending entries held by a [Subscriber] from going
// idle, so that a peer does not claim and re-run work that is slow but
// healthy.
//
// Redis counts an entry's idle time from its delivery, and the claim loop
// hands an entry idle past MaxIdleTime to another consumer. A consumer holds
// more than the message its handler is working on: upstream reads ahead, so
// each consumer also holds up to two delivered entries (one buffered, one in
// the reader's hand) whose idle clocks run while the handler works. Those
// would be claimed and run twice just as surely as the message in the
// handler. So entries are tracked where they are delivered and settled: the
// subscriber's client registers each entry its XREADGROUP or XCLAIM returns
// and forgets it on XACK. That covers the time in the handler, the time
// waiting for vertex budget, and the read-ahead, with no middleware to
// install or order.
//
// One goroutine per subscriber refreshes every tracked entry each
// KeepAlive.Interval, in one script call per stream (XCLAIM to the owning
// consumer with JUSTID, after checking it still owns the entry).
//
// A consumer that holds entries but has acked none for KeepAlive.MaxInFlight
// is presumed stuck: none of the entries it holds on that stream are
// refreshed any more, so peers claim them MaxIdleTime afterwards, and until
// its next ack it neither keeps new entries alive nor claims idle ones
// itself (they would only queue behind the stuck handler). A consumer that
// keeps acking keeps everything it holds alive, however long each message
// takes.
//
// keepAlive is safe for concurrent use. It belongs to its Subscriber and
// stops when the subscriber is closed, leaving what it held to expire.
type keepAlive struct {
	client    redis.UniversalClient // the subscriber's control client
	group     string
	interval  time.Duration
	maxFlight time.Duration
	disabled  bool
	logger    watermill.LoggerAdapter

	idle    time.Duration // MaxIdleTime: a peer may claim an entry this long after its last refresh was sent
	margin  time.Duration // how long before a peer could claim an entry it is given up
	mu      sync.Mutex
	entries map[kaKey]*kaEntry      // entries kept alive
	pipes   map[kaPipe]*kaPipeState // pipes holding entries, or stuck
	states  map[kaKey]*revState     // every entry delivered and not yet acked, kept alive or not
	// handed finds the record in states of a message handed over, by the
	// message: the hooks a message's handler calls (watch, complete)
	// look it up without reading the entry's identity from metadata.
	handed map[*message.Message]*revState
	// nextLapse is when watchLapses looks again; an entry tracked with an
	// earlier lapse wakes it through lapseWake.
	nextLapse time.Time
	lapseWake chan struct{}

	// left is what ended subscriptions held and nobody here will run:
	// entries never handed over (msg nil) or whose message was nacked.
	// Close releases them (releaseLeft).
	left []leftEntry

	refreshed, lost, expired, errs, revoked atomic.Uint64

	stop chan struct{}
	done chan struct{}
}

func newKeepAlive(client redis.UniversalClient, cfg Config, logger watermill.LoggerAdapter) *keepAlive {
	k := &keepAlive{
		client:    client,
		group:     cfg.ConsumerGroup,
		interval:  cfg.KeepAlive.Interval,
		maxFlight: cfg.KeepAlive.MaxInFlight,
		disabled:  cfg.KeepAlive.Disabled,
		idle:      cfg.MaxIdleTime,
		margin:    lapseMargin(cfg.MaxIdleTime, cfg.KeepAlive.Interval),
		logger:    logger,
		entries:   make(map[kaKey]*kaEntry),
		pipes:     make(map[kaPipe]*kaPipeState),
		states:    make(map[kaKey]*revState),
		handed:    make(map[*message.Message]*revState),
		lapseWake: make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	if k.disabled {
		close(k.done)
		return k
	}
	go k.run()
	return k
}

// lapseMargin is how long before a peer could claim an entry the
// keep-alive gives it up: a twentieth of MaxIdleTime, less if refreshes
// come so close to MaxIdleTime that this would give up entries a refresh
// is about to keep.
func lapseMargin(idle, interval time.Duration) time.Duration {
	return max(0, min(idle/20, (idle-interval)/2))
}

// lapsesAt is when this subscriber stops counting on owning e: a margin
// before the earliest moment a peer's claim can take it.
func (k *keepAlive) lapsesAt(e *kaEntry) time.Time {
	return e.refreshed.Add(k.idle - k.margin)
}

// track registers entries just delivered to consumer for sub, by a read
// or claim sent now.
func (k *keepAlive) track(sub *subscription, stream, consumer string, ids ...string) {
	k.trackSent(time.Now(), sub, stream, consumer, ids...)
}

// trackSent registers entries delivered to consumer for sub by a read or
// claim sent at sent. Entries delivered after sub ended are not tracked:
// nobody will process them here, so they are left to the idle claim.
func (k *keepAlive) trackSent(sent time.Time, sub *subscription, stream, consumer string, ids ...string) {
	if k.disabled || len(ids) == 0 {
		return
	}
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if sub != nil && sub.ended {
		return
	}
	if sent.Add(k.idle - k.margin).Before(k.nextLapse) { // lapses before watchLapses looks
		select {
		case k.lapseWake <- struct{}{}:
		default:
		}
	}
	pk := kaPipe{sub: sub, stream: stream, consumer: consumer}
	p := k.pipes[pk]
	if p == nil {
		p = &kaPipeState{}
		k.pipes[pk] = p
	}
	if p.held == 0 && !p.stuck {
		p.progressAt = now
	}
	for _, id := range ids {
		key := kaKey{stream: stream, id: id, consumer: consumer}
		if _, dup := k.entries[key]; dup {
			k.dropLocked(key)
		}
		// One allocation for both records of the entry.
		t := &kaTracked{kaEntry: kaEntry{sub: sub, refreshed: sent}}
		k.entries[key] = &t.kaEntry
		k.setStateLocked(key, &t.revState) // delivered again: a new life
		p.held++
	}
}

// forget drops entries acked by consumer, and records the progress.
func (k *keepAlive) forget(sub *subscription, stream, consumer string, ids ...string) {
	if k.disabled || len(ids) == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, id := range ids {
		key := kaKey{stream: stream, id: id, consumer: consumer}
		k.dropLocked(key)
		k.setStateLocked(key, nil)
	}
	pk := kaPipe{sub: sub, stream: stream, consumer: consumer}
	if p := k.pipes[pk]; p != nil {
		p.progressAt, p.stuck = time.Now(), false
		if p.held <= 0 {
			delete(k.pipes, pk)
		}
	}
}

// ended drops every entry delivered to sub, which has ended: what it held
// is left to the idle claim. Entries delivered to it later are not tracked.
func (k *keepAlive) ended(sub *subscription) {
	k.mu.Lock()
	defer k.mu.Unlock()
	sub.ended = true
	for key, e := range k.entries {
		if e.sub == sub {
			if st := k.states[key]; st != nil && !st.revoked {
				k.left = append(k.left, leftEntry{key: key, msg: st.msg})
			}
			k.dropLocked(key)
			k.setStateLocked(key, nil)
		}
	}
	for pk := range k.pipes {
		if pk.sub == sub {
			delete(k.pipes, pk)
		}
	}
}

// setStateLocked makes st the record of key's delivery, or removes the
// record if st is nil. The message of the record it replaces no longer
// finds it.
func (k *keepAlive) setStateLocked(key kaKey, st *revState) {
	if old := k.states[key]; old != nil && old.msg != nil {
		delete(k.handed, old.msg)
	}
	if st == nil {
		delete(k.states, key)
		return
	}
	k.states[key] = st
}

// dropLocked stops tracking key. A stuck pipe is kept (with nothing held)
// so that entries it takes later are not kept alive either.
func (k *keepAlive) dropLocked(key kaKey) bool {
	e, ok := k.entries[key]
	if !ok {
		return false
	}
	delete(k.entries, key)
	pk := kaPipe{sub: e.sub, stream: key.stream, consumer: key.consumer}
	if p := k.pipes[pk]; p != nil {
		p.held--
		if p.held <= 0 && !p.stuck {
			delete(k.pipes, pk)
		}
	}
	return true
}

// revokeLocked stops keeping key alive and revokes it: the channel
// Revoked returned for it closes. It reports whether key was kept alive.
func (k *keepAlive) revokeLocked(key kaKey) bool {
	kept := k.dropLocked(key)
	st := k.states[key]
	if st == nil || st.revoked {
		return kept
	}
	st.revoked = true
	if st.ch != nil {
		close(st.ch)
	}
	k.revoked.Add(1)
	return kept
}

// revokeStream revokes every entry of stream held by this subscriber: the
// group was recreated, so none of them is pending any more.
func (k *keepAlive) revokeStream(stream string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key := range k.states {
		if key.stream == stream {
			k.revokeLocked(key)
		}
	}
}

// watch returns the channel that closes when the entry of msg, handed
// over (attempt), is revoked, and counts the current attempt as watched;
// nil if msg is not the message of an entry delivered and not yet acked
// here, or the keep-alive is off (nothing can tell).
func (k *keepAlive) watch(msg *message.Message) <-chan struct{} {
	if k.disabled {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	st := k.handed[msg]
	if st == nil {
		return nil
	}
	st.watched = true
	if st.ch == nil {
		st.ch = make(chan struct{})
		if st.revoked {
			close(st.ch)
		}
	}
	return st.ch
}

// attempt starts a new delivery attempt of key, whose message is msg: it
// is handed over (again, after a nack, as a copy), so what the previous
// attempt completed no longer counts, and watch and complete find key's
// record by msg from now on. It is handover without the answer.
func (k *keepAlive) attempt(key kaKey, msg *message.Message) {
	k.handover(key, msg)
}

// handover starts a new delivery attempt of key, whose message is msg, as
// attempt does, unless key may already belong to a peer: revoked, or its
// claim lapsing now (it is revoked then). It reports whether msg may be
// handed over. If not, msg must not run; the entry is marked as stepped
// aside, so that msg's ack never reaches Redis (mayAck) and the entry
// stays pending for whoever claims it.
func (k *keepAlive) handover(key kaKey, msg *message.Message) bool {
	if k.disabled {
		return true // nothing is tracked
	}
	now := time.Now()
	k.mu.Lock()
	st := k.states[key]
	if st == nil {
		k.mu.Unlock()
		return true
	}
	lapsed := false
	if e := k.entries[key]; e != nil && !now.Before(k.lapsesAt(e)) {
		lapsed = k.revokeLocked(key)
	}
	if st.revoked {
		st.watched, st.completed = true, false
		k.mu.Unlock()
		if lapsed {
			k.logLapsed(key)
		}
		return false
	}
	defer k.mu.Unlock()
	st.watched, st.completed = false, false
	if st.msg != msg {
		if st.msg != nil {
			delete(k.handed, st.msg)
		}
		st.msg = msg
		k.handed[msg] = st
	}
	return true
}

// holds reports whether the entry id of stream, delivered to consumer, is
// still held here: delivered and not yet settled (in a handler, waiting,
// read ahead, or acked with the ack not yet in Redis). An entry this
// subscriber gave up (revoked before it ran, or read ahead and never
// handed over) is not held: its ack will never reach Redis, so a sibling
// consumer may claim it as a peer would.
func (k *keepAlive) holds(stream, consumer, id string) bool {
	if k.disabled {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	st, ok := k.states[kaKey{stream: stream, id: id, consumer: consumer}]
	if !ok {
		return false
	}
	givenUp := st.revoked && (st.msg == nil || st.watched && !st.completed)
	return !givenUp
}

// complete records that the handler of msg's current attempt succeeded.
func (k *keepAlive) complete(msg *message.Message) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st := k.handed[msg]; st != nil {
		st.completed = true
	}
}

// mayAck reports whether an ack of key may reach Redis: always, unless
// key was revoked while a watched attempt had not completed (a message
// that stepped aside without running).
func (k *keepAlive) mayAck(key kaKey) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	st := k.states[key]
	return st == nil || !st.revoked || !st.watched || st.completed
}

// stuck reports whether consumer has a pipe presumed stuck. Its claim loop
// then leaves idle entries to peers: anything it claimed would only queue
// behind the stuck handler.
func (k *keepAlive) stuck(consumer string) bool {
	if k.disabled {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for pk, p := range k.pipes {
		if pk.consumer == consumer && p.stuck {
			return true
		}
	}
	return false
}

// keepAliveStats counts what the keep-alive did (see [SubscriberStats]).
type keepAliveStats struct {
	Tracked                                   int
	Refreshed, Lost, Expired, Errors, Revoked uint64
}

// stats returns counters since the subscriber was created.
func (k *keepAlive) stats() keepAliveStats {
	k.mu.Lock()
	n := len(k.entries)
	k.mu.Unlock()
	return keepAliveStats{
		Tracked:   n,
		Refreshed: k.refreshed.Load(),
		Lost:      k.lost.Load(),
		Expired:   k.expired.Load(),
		Errors:    k.errs.Load(),
		Revoked:   k.revoked.Load(),
	}
}

// withdraw records that msg, handed over for key, never reached the
// subscriber's user (the subscription ended first): the entry counts as
// never handed over.
func (k *keepAlive) withdraw(key kaKey, msg *message.Message) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st := k.states[key]; st != nil && st.msg == msg {
		delete(k.handed, msg)
		st.msg = nil
	}
}

// leftEntry is an entry an ended subscription held, and the message it
// was last handed over as (nil if never).
type leftEntry struct {
	key kaKey
	msg *message.Message
}

// releaseLeft makes the entries ended subscriptions left behind claimable
// by peers at once, instead of after MaxIdleTime: those never handed to a
// handler (their delivery is taken back) and those whose message was
// nacked. A message handed over and neither acked nor nacked may still be
// running in a handler, so it is left to the idle claim. Call it once the
// subscriptions have ended and acks are settled. It returns how many
// entries it asked Redis to release.
func (k *keepAlive) releaseLeft(ctx context.Context) int {
	k.mu.Lock()
	left := k.left
	k.left = nil
	k.mu.Unlock()
	idle := strconv.FormatInt((2 * k.idle).Milliseconds(), 10)
	byStream := make(map[string][]any)
	n := 0
	for _, l := range left {
		back := "1"
		if l.msg != nil {
			select {
			case <-l.msg.Nacked():
				back = "0"
			default:
				continue
			}
		}
		byStream[l.key.stream] = append(byStream[l.key.stream], l.key.consumer, l.key.id, back)
		n++
	}
	for stream, triples := range byStream {
		for len(triples) > 0 {
			m := min(len(triples), 3*refreshBatch)
			if err := k.reclaim(ctx, stream, idle, triples[:m]); err != nil {
				k.errs.Add(1)
				k.logger.Error("Could not release the entries a closing subscriber left; peers claim them after MaxIdleTime", err,
					watermill.LogFields{"stream": stream, "entries": m / 3})
			}
			triples = triples[m:]
		}
	}
	return n
}

func (k *keepAlive) close() {
	if !k.disabled {
		close(k.stop)
	}
	<-k.done
}

func (k *keepAlive) run() {
	defer close(k.done)
	var lapses sync.WaitGroup
	lapses.Go(k.watchLapses)
	defer lapses.Wait()
	t := time.NewTicker(k.interval)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-k.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-k.stop:
			return
		case <-t.C:
			k.refresh(ctx)
		}
	}
}

// watchLapses revokes each entry as its claim lapses (lapsesAt), before a
// peer can claim it. It runs on a goroutine of its own, so a refresh
// hanging on an unreachable Redis cannot hold it back.
func (k *keepAlive) watchLapses() {
	t := time.NewTimer(k.interval)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-t.C:
		case <-k.lapseWake:
		}
		t.Reset(k.revokeLapsed(time.Now()))
	}
}

// revokeLapsed revokes the entries whose claim has lapsed at now, and
// returns how long until the next one lapses (at most an interval).
func (k *keepAlive) revokeLapsed(now time.Time) time.Duration {
	next := k.interval
	var lapsed []kaKey
	k.mu.Lock()
	for key, e := range k.entries {
		if d := k.lapsesAt(e).Sub(now); d > 0 {
			next = min(next, d)
		} else {
			lapsed = append(lapsed, key)
		}
	}
	for _, key := range lapsed {
		k.revokeLocked(key)
	}
	k.nextLapse = now.Add(next)
	k.mu.Unlock()
	for _, key := range lapsed {
		k.logLapsed(key)
	}
	return next
}

func (k *keepAlive) logLapsed(key kaKey) {
	k.logger.Info("Entry could not be refreshed in time; a peer may claim it, so this consumer gives it up",
		watermill.LogFields{"stream": key.stream, "xid": key.id, "consumer": key.consumer})
}

// refresh sends one batch of refreshes per stream.
func (k *keepAlive) refresh(ctx context.Context) {
	now := time.Now()
	byStream := make(map[string][]any)
	var expired []kaKey
	k.mu.Lock()
	for _, p := range k.pipes {
		if !p.stuck && now.Sub(p.progressAt) >= k.maxFlight {
			p.stuck = true
		}
	}
	for key, e := range k.entries {
		if p := k.pipes[kaPipe{sub: e.sub, stream: key.stream, consumer: key.consumer}]; p != nil && p.stuck {
			expired = append(expired, key)
			continue
		}
		if !now.Before(k.lapsesAt(e)) {
			continue // given up: watchLapses revokes it
		}
		byStream[key.stream] = append(byStream[key.stream], key.consumer, key.id)
	}
	// Entries the stuck consumer never handed over (read-ahead behind
	// the stuck handler) did not run here: their delivery is given back
	// below, so that they are not dead-lettered with a poison entry that
	// hangs one consumer after another. An entry handed over after this
	// finds itself revoked and steps aside.
	unstarted := make(map[string][]any)
	for _, key := range expired {
		if st := k.states[key]; st != nil && st.msg == nil {
			unstarted[key.stream] = append(unstarted[key.stream], key.consumer, key.id)
		}
		k.revokeLocked(key)
	}
	k.mu.Unlock()
	for _, key := range expired {
		k.expired.Add(1)
		k.logger.Info("Consumer made no progress for KeepAlive.MaxInFlight; its entry is no longer kept alive and a peer will claim it",
			watermill.LogFields{"stream": key.stream, "xid": key.id, "consumer": key.consumer})
	}
	if len(byStream) == 0 && len(unstarted) == 0 {
		return
	}
	// A refresh slower than a tick is pointless: the next tick sends a
	// fresh batch.
	ctx, cancel := context.WithTimeout(ctx, k.interval)
	defer cancel()
	for stream, pairs := range unstarted {
		for len(pairs) > 0 {
			n := min(len(pairs), 2*refreshBatch)
			k.giveBack(ctx, stream, pairs[:n])
			pairs = pairs[n:]
		}
	}
	for stream, pairs := range byStream {
		for len(pairs) > 0 {
			n := min(len(pairs), 2*refreshBatch)
			k.refreshStream(ctx, stream, pairs[:n])
			pairs = pairs[n:]
		}
	}
}

func (k *keepAlive) refreshStream(ctx context.Context, stream string, pairs []any) {
	args := make([]any, 0, len(pairs)+1)
	args = append(args, k.group)
	args = append(args, pairs...)
	// Redis resets the idle clocks after this, at the earliest: the
	// moment a peer's claim is measured from.
	sent := time.Now()
	res, err := refreshScript.Run(ctx, k.client, []string{stream}, args...).Slice()
	if err != nil {
		if ctx.Err() == nil {
			k.errs.Add(1)
			k.logger.Error("Keep-alive refresh failed", err, watermill.LogFields{"stream": stream, "entries": len(pairs) / 2})
		}
		return
	}
	lostIDs, goneIDs := scriptIDs(res, 0), scriptIDs(res, 1)
	k.refreshed.Add(uint64(len(pairs)/2 - len(lostIDs) - len(goneIDs)))
	lost := make(map[string]struct{}, len(lostIDs))
	for _, id := range lostIDs {
		lost[id] = struct{}{}
	}
	n := 0
	k.mu.Lock()
	for i := 0; i < len(pairs); i += 2 {
		key := kaKey{stream: stream, consumer: pairs[i].(string), id: pairs[i+1].(string)}
		if _, gone := lost[key.id]; !gone {
			// An entry revoked meanwhile is no longer here: once given
			// up, it stays given up.
			if e := k.entries[key]; e != nil && e.refreshed.Before(sent) {
				e.refreshed = sent
			}
			continue
		}
		// Acked in the meantime (already dropped), or taken by a peer:
		// either way there is nothing left to refresh, and a message
		// still waiting for it must step aside.
		if k.revokeLocked(key) {
			n++
		}
	}
	k.mu.Unlock()
	if n > 0 {
		k.lost.Add(uint64(n))
		k.logger.Info("Held entries were claimed by another consumer; they may run twice",
			watermill.LogFields{"stream": stream, "entries": n})
	}
}

// reclaim runs reclaimScript for consumer/ID/giveBack triples of stream,
// setting their idle time to idle milliseconds ("" keeps it).
func (k *keepAlive) reclaim(ctx context.Context, stream, idle string, triples []any) error {
	args := append([]any{k.group, idle}, triples...)
	return reclaimScript.Run(ctx, k.client, []string{stream}, args...).Err()
}

// giveBack takes back the delivery of consumer/ID pairs of stream, their
// owner and idle time left as they are (reclaimScript). On failure the
// entries keep the delivery: they may be dead-lettered one delivery early,
// which is logged.
func (k *keepAlive) giveBack(ctx context.Context, stream string, pairs []any) {
	triples := make([]any, 0, len(pairs)/2*3)
	for i := 0; i+1 < len(pairs); i += 2 {
		triples = append(triples, pairs[i], pairs[i+1], "1")
	}
	if err := k.reclaim(ctx, stream, "", triples); err != nil && ctx.Err() == nil {
		k.errs.Add(1)
		k.logger.Error("Could not take back the deliveries of entries a stuck consumer never started; they count as delivered", err,
			watermill.LogFields{"stream": stream, "entries": len(pairs) / 2})
	}
}

// scriptIDs returns the i-th list of IDs in the refresh script's reply.
func scriptIDs(reply []any, i int) []string {
	if i >= len(reply) {
		return nil
	}
	list, _ := reply[i].([]any)
	ids := make([]string, 0, len(list))
	for _, v := range list {
		if id, ok := v.(string); ok {
			ids = append(ids, id)
		}
	}
	return ids
}
