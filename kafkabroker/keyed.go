package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
)

// keySubscriber is the subscriber of consumer key ([ConsumerKey]): a
// Watermill subscriber on a Sarama consumer group that hands over many
// records of a partition at once, so the vertex budget, not the partition
// count, bounds a member's concurrency. [Cluster.NewSubscriber] builds
// one when Config.Consumer is key.
//
// Handlers see the same *message.Message as with watermill-kafka: the
// same unmarshaler builds it, and its context carries the partition,
// offset, timestamp and key that [PartitionFromCtx] and its siblings
// read (watermill-kafka's own getters see only its subscriber's messages).
//
// Guarantees, per partition:
//
//   - Order per key: records with the same Kafka key are handed over one
//     at a time, in offset order; the next is sent only once the previous
//     one is acked. Records without a key share one order, the
//     partition's. Different keys run concurrently.
//   - Window: at most Config.WindowMessages records and
//     Config.WindowBytes bytes are read but not yet finished (handed
//     over, or waiting behind their key). A record that finished behind an
//     unfinished one leaves the window at once (it is kept as an offset
//     until the watermark passes it), but at most eight times
//     Config.WindowMessages records are read and not yet committed. When
//     either is full the partition is paused (Sarama stops fetching it;
//     heartbeats go on); a record larger than the whole window is
//     admitted alone.
//   - Commits: the committed offset is the contiguous completed
//     watermark, never past a record that is unfinished or nacked. A
//     nacked message blocks its key only and is sent again, in process,
//     after Config.NackResendSleep.
//   - Rebalance: as with partition mode and the [SessionTracker],
//     messages still waiting for budget step aside when the session ends,
//     admitted work finishes and is committed, and records that completed
//     beyond the watermark are written in the commit's metadata so the
//     next owner skips them.
//   - Crash: the next owner starts from the committed watermark, so it
//     processes again at most the span of each partition: eight times
//     Config.WindowMessages records.
//
// Each Subscribe call joins the consumer group with a client of its own.
// A keySubscriber is safe for concurrent use.
type keySubscriber struct {
	cfg       Config
	brokers   []string
	sarama    *sarama.Config
	group     string
	unmarshal kafka.Unmarshaler
	keys      *keyTracker // its SessionTracker's mode
	logger    watermill.LoggerAdapter

	closing   chan struct{}
	closeOnce sync.Once
	mu        sync.Mutex
	closed    bool
	wg        sync.WaitGroup // subscriptions
}

// errSubscriberClosed is returned by Subscribe after Close.
var errSubscriberClosed = fmt.Errorf("kafkabroker: key subscriber: %w", spillway.ErrClosed)

// newKeySubscriber returns a keySubscriber in consumer group group, and
// its [SessionTracker] (see [Cluster.NewSubscriber]).
func (c *Cluster) newKeySubscriber(group string) (*keySubscriber, *SessionTracker, error) {
	hook := c.opts.saramaHook
	scfg, err := c.cfg.subscriberSarama(func(sc *sarama.Config) error {
		c.cfg.keyFetch(sc)
		// The partitions' loops commit their watermarks themselves
		// (keySession.commitLoop), on a connection of their own: an
		// automatic commit on the consumer's connection would only add
		// a second, slower path that can land after a newer commit.
		sc.Consumer.Offsets.AutoCommit.Enable = false
		if hook != nil {
			return hook(sc)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if !scfg.Version.IsAtLeast(sarama.V0_10_2_0) {
		return nil, nil, &spillway.FieldError{Field: "version", Value: c.cfg.Version, Reason: "must be at least 0.10.2 with consumer key (Sarama's consumer groups)"}
	}
	kt := newKeyTracker(c.opts.tracer, group, c.seen)
	s := &keySubscriber{
		cfg:       c.cfg,
		brokers:   c.brokers,
		sarama:    scfg,
		group:     group,
		unmarshal: c.marshaler,
		keys:      kt,
		logger:    c.logger,
		closing:   make(chan struct{}),
	}
	return s, kt.st, nil
}

// keyMaxWait bounds how long a fetch waits for new records in key mode.
const keyMaxWait = 50 * time.Millisecond

// defaultLargestRecord is the largest record a cluster accepts by default
// (message.max.bytes is 1 MiB and a little), batch framing included.
const defaultLargestRecord = 1<<20 + batchHeadroom

// keyFetch sizes the fetch of consumer key: at least the largest record
// the cluster accepts, so no record is ever fetched partially. A broker
// returns a batch larger than a partition's fetch size only when it comes
// first in the whole response, so such a record would wait until the other
// partitions are drained. The byte window and the read-ahead, not the
// fetch size, bound what the consumer holds: a paused partition is not
// fetched.
func (k Config) keyFetch(c *sarama.Config) {
	largest := k.batchLimit()
	if largest == 0 {
		largest = defaultLargestRecord
	}
	c.Consumer.Fetch.Default = max(c.Consumer.Fetch.Default, largest)
	// A resumed partition is fetched only once the broker answers the
	// fetch in flight for the others, which waits up to MaxWaitTime when
	// they have nothing new: keep that short, since pausing is routine.
	c.Consumer.MaxWaitTime = min(c.Consumer.MaxWaitTime, keyMaxWait)
	if c.Consumer.Fetch.Max > 0 {
		c.Consumer.Fetch.Default = min(c.Consumer.Fetch.Default, c.Consumer.Fetch.Max)
	}
}

// Subscribe joins the consumer group on topic and returns the messages.
// The channel closes after ctx ends or Close is called, once every
// message handed over is settled. Each subscription opens two Sarama
// clients: one consumes, the other commits the watermarks (a commit on
// the consuming connection would wait behind its fetches).
func (s *keySubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errSubscriberClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	if err := probe(s.brokers, s.sarama); err != nil {
		s.wg.Done()
		return nil, fmt.Errorf("kafkabroker: connecting to %v: %w", s.brokers, err)
	}
	client, err := sarama.NewClient(s.brokers, s.sarama)
	if err != nil {
		s.wg.Done()
		return nil, fmt.Errorf("kafkabroker: connecting to %v: %w", s.brokers, listenerHint(err, s.brokers))
	}
	commitClient, err := sarama.NewClient(s.brokers, s.sarama)
	if err != nil {
		_ = client.Close()
		s.wg.Done()
		return nil, fmt.Errorf("kafkabroker: connecting to %v: %w", s.brokers, listenerHint(err, s.brokers))
	}
	group, err := sarama.NewConsumerGroupFromClient(s.group, client)
	if err != nil {
		_ = commitClient.Close()
		_ = client.Close()
		s.wg.Done()
		return nil, fmt.Errorf("kafkabroker: consumer group %s: %w", s.group, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan *message.Message)
	h := &keyHandler{s: s, topic: topic, out: out, ctx: ctx, group: group, client: client,
		commits:   &committer{client: commitClient, group: s.group, conf: s.sarama},
		logFields: watermill.LogFields{"consumer_group": s.group, "topic": topic}}
	handler := s.keys.st.tracer().WrapConsumerGroupHandler(h)
	go func() {
		select {
		case <-s.closing:
		case <-ctx.Done():
		}
		cancel()
	}()
	errsDone := make(chan struct{})
	go func() {
		defer close(errsDone)
		for err := range group.Errors() {
			s.logger.Error("Kafka consumer group error", err, h.logFields)
		}
	}()
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer cancel()
		for ctx.Err() == nil {
			err := group.Consume(ctx, []string{topic}, handler)
			if errors.Is(err, sarama.ErrClosedConsumerGroup) || ctx.Err() != nil {
				break
			}
			if err != nil {
				s.logger.Error("Kafka consumer group session failed, rejoining", err, h.logFields)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}
		if err := group.Close(); err != nil {
			s.logger.Info("Closing the Kafka consumer group", h.logFields.Add(watermill.LogFields{"err": err.Error()}))
		}
		<-errsDone
		_ = commitClient.Close()
		_ = client.Close()
	}()
	return out, nil
}

// Close leaves the consumer groups and closes every subscription's
// channel. Messages handed over and not yet acked are not committed: the
// next owner of their partitions receives them again. Later calls return
// nil.
func (s *keySubscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.closing)
	})
	s.wg.Wait()
	return nil
}

// keyHandler is the consumer group handler of one subscription.
type keyHandler struct {
	s         *keySubscriber
	topic     string
	out       chan *message.Message
	ctx       context.Context // the subscription's: ends with Close
	group     sarama.ConsumerGroup
	client    sarama.Client
	commits   *committer
	logFields watermill.LogFields

	mu   sync.Mutex
	sess *keySession
}

// keySession is one consumer-group session of a subscription: its
// partitions and the committer they share.
type keySession struct {
	h    *keyHandler
	sess sarama.ConsumerGroupSession
	skip map[int32]completedSet // records the previous owner completed beyond its watermark

	mu    sync.Mutex
	parts map[int32]*keyPartition

	nudge  chan struct{} // a partition marked a new watermark
	urgent chan struct{} // ... and its window is a quarter full
	stop   chan struct{}
	done   chan struct{}
}

func (h *keyHandler) Setup(sess sarama.ConsumerGroupSession) error {
	ks := &keySession{h: h, sess: sess, parts: make(map[int32]*keyPartition),
		nudge: make(chan struct{}, 1), urgent: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	ks.skip = h.fetchCompleted(sess.Claims()[h.topic])
	h.mu.Lock()
	h.sess = ks
	h.mu.Unlock()
	go ks.commitLoop()
	return nil
}

func (h *keyHandler) Cleanup(sess sarama.ConsumerGroupSession) error {
	h.mu.Lock()
	ks := h.sess
	h.sess = nil
	h.mu.Unlock()
	if ks != nil {
		close(ks.stop)
		<-ks.done
	}
	// Every partition has marked its final watermark; Sarama commits
	// again when it releases the session.
	sess.Commit()
	return nil
}

// commitInterval is how long a moved watermark may wait for its commit
// while its window is less than a quarter full.
const commitInterval = 50 * time.Millisecond

// commitLoop commits the marked watermarks, one commit at a time: at once
// when a window is a quarter full (the commit is what frees it), otherwise
// within commitInterval of the first mark; then it tells the partitions
// what is committed so they can release their window.
func (ks *keySession) commitLoop() {
	defer close(ks.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	armed := false
	for {
		select {
		case <-ks.stop:
			return
		case <-ks.nudge:
			if !armed {
				timer.Reset(commitInterval)
				armed = true
			}
			continue
		case <-timer.C:
		case <-ks.urgent:
			if armed {
				timer.Stop()
			}
		}
		armed = false
		ks.mu.Lock()
		parts := make([]*keyPartition, 0, len(ks.parts))
		marks := make([]int64, 0, len(ks.parts))
		for _, p := range ks.parts {
			parts = append(parts, p)
			marks = append(marks, p.marked.Load())
		}
		ks.mu.Unlock()
		ks.commit(parts, marks)
		for i, p := range parts {
			if marks[i] > p.committed.Load() {
				p.committed.Store(marks[i])
				select {
				case p.wake <- struct{}{}:
				default:
				}
			}
		}
	}
}

// commit commits the watermarks marks of parts that moved since their
// last commit, on the committer's own connection; if that fails, through
// the session's offset manager, which commits every marked offset on the
// consumer's connection.
func (ks *keySession) commit(parts []*keyPartition, marks []int64) {
	offsets := make(map[int32]int64, len(parts))
	for i, p := range parts {
		if marks[i] > p.committed.Load() {
			offsets[p.partition] = marks[i]
		}
	}
	if len(offsets) == 0 {
		return
	}
	h := ks.h
	if err := h.commits.commit(ks.sess, h.topic, offsets); err != nil {
		h.s.logger.Debug("Committing on the commit connection failed, committing through the session", h.logFields.Add(watermill.LogFields{"err": err.Error()}))
		ks.sess.Commit()
	}
}

// fetchCompleted reads the metadata of the group's committed offsets for
// partitions: the records an earlier owner completed beyond its watermark.
// Failing to read it costs only duplicates, so it is logged, not returned.
func (h *keyHandler) fetchCompleted(partitions []int32) map[int32]completedSet {
	out := make(map[int32]completedSet)
	if len(partitions) == 0 {
		return out
	}
	fail := func(err error) map[int32]completedSet {
		h.s.logger.Info("Cannot read the committed metadata: records completed beyond the watermark will be processed again",
			h.logFields.Add(watermill.LogFields{"err": err.Error()}))
		return out
	}
	broker, err := h.client.Coordinator(h.s.group)
	if err != nil {
		return fail(err)
	}
	req := sarama.NewOffsetFetchRequest(h.client.Config().Version, h.s.group, map[string][]int32{h.topic: partitions})
	resp, err := broker.FetchOffset(req)
	if err != nil {
		return fail(err)
	}
	for _, p := range partitions {
		b := resp.GetBlock(h.topic, p)
		if b == nil || b.Err != sarama.ErrNoError || b.Offset < 0 {
			continue
		}
		if set, ok := decodeCompleted(b.Offset, b.Metadata); ok {
			out[p] = set
		}
	}
	return out
}

func (h *keyHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	h.mu.Lock()
	ks := h.sess
	h.mu.Unlock()
	if ks == nil {
		return nil
	}
	t := h.s.keys.st
	tp := topicPartition{claim.Topic(), claim.Partition()}
	p := &keyPartition{
		h:            h,
		ks:           ks,
		sess:         sess,
		sessDone:     sess.Context().Done(),
		subDone:      h.ctx.Done(),
		topic:        tp.topic,
		partition:    tp.partition,
		gp:           groupPartition{t.group, tp},
		failedBefore: t.seen.failedFrom(groupPartition{t.group, tp}, claim.InitialOffset()),
		skip:         ks.skip[tp.partition],
		w:            newKeyWindow[*keyDelivery](h.s.cfg.WindowMessages, h.s.cfg.WindowBytes, claim.InitialOffset()),
		settled:      make(chan struct{}, 1),
		wake:         make(chan struct{}, 1),
	}
	p.marked.Store(-1)
	p.committed.Store(claim.InitialOffset())
	ks.mu.Lock()
	ks.parts[tp.partition] = p
	ks.mu.Unlock()
	h.s.keys.register(tp, p)
	defer h.s.keys.unregister(tp, p)
	return p.run(claim)
}

// keyEvent settles one delivery.
type keyEvent struct {
	d    *keyDelivery
	done bool // acked and counted; false: abandoned (the session or subscription ended)
}

// keyPartition is one claimed partition: the Sarama side of its
// keyWindow, which does the bookkeeping. Its fields below the line are
// owned by the run goroutine.
type keyPartition struct {
	h         *keyHandler
	ks        *keySession
	sess      sarama.ConsumerGroupSession
	sessDone  <-chan struct{}
	subDone   <-chan struct{} // the subscription's context ended
	topic     string
	partition int32
	gp        groupPartition
	// failedBefore is the offsets whose handler failed in an earlier
	// session (SessionTracker.Redelivered); read-only.
	failedBefore map[int64]struct{}
	failedNow    atomic.Bool // a handler failed a record in this session

	// Deliveries report to the loop through reports: the loop is woken
	// once per batch of reports rather than once per delivery.
	reportMu sync.Mutex
	reports  []keyEvent
	spare    []keyEvent    // the loop's emptied batch, reused
	settled  chan struct{} // reports went from empty to not empty
	wake     chan struct{}
	wg       sync.WaitGroup // delivery goroutines

	marked    atomic.Int64 // watermark marked, -1 none yet
	committed atomic.Int64 // watermark committed

	// ---- owned by run ----
	w        *keyWindow[*keyDelivery] // its fill is read by the tracker
	skip     completedSet
	inflight int // deliveries handed over and not settled
	stopping bool
	stopErr  error
	lastMark int64
}

// keyDelivery is one record read and not yet committed. Once done, only
// its offset matters: the message and the record's value are let go.
type keyDelivery struct {
	keyRecord
	p   *keyPartition
	rec *sarama.ConsumerMessage
	msg *message.Message
	ctx *deliveryContext // ended once settled, as Watermill expects after an ack

	// completed: the handler succeeded in this delivery attempt
	// (SessionTracker.Completed), so an ack after the session ended still
	// counts.
	completed atomic.Bool
}

func (d *keyDelivery) record() *keyRecord { return &d.keyRecord }

func recordSize(m *sarama.ConsumerMessage) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		if h != nil {
			n += len(h.Key) + len(h.Value)
		}
	}
	return n
}

// run is the partition's loop: it reads records while the window has
// room, hands them over key by key, settles deliveries, and marks the
// watermark. It returns once the session or subscription ended and every
// delivery is settled.
func (p *keyPartition) run(claim sarama.ConsumerGroupClaim) error {
	p.lastMark = claim.InitialOffset()
	records := claim.Messages()
	sessDone, subDone := p.sessDone, p.h.ctx.Done()
	for {
		var in <-chan *sarama.ConsumerMessage
		if p.stopping {
			// Closed channels would spin the loop while deliveries settle.
			sessDone, subDone = nil, nil
		} else {
			// Read on even when the window is full: records wait in
			// the read-ahead, and once that is full the partition is
			// paused, so only what Sarama had already fetched arrives;
			// a claim whose channel is not drained would hold up every
			// partition of its broker's fetch loop.
			in = records
		}
		select {
		case rec, ok := <-in:
			if !ok {
				p.stop(nil)
				break
			}
			p.readAhead(rec)
			p.readReady(in)
			p.w.publishReadAhead()
		case <-p.settled:
			p.settleReady()
		case <-p.wake:
			c := p.committed.Load()
			p.w.commit(c)
			if p.failedNow.Load() {
				p.h.s.keys.st.seen.forget(p.gp, c)
			}
		case <-sessDone:
			p.stop(nil)
		case <-subDone:
			p.stop(nil)
		}
		if !p.stopping {
			p.admit()
		}
		p.markWatermark(false)
		if p.stopping && p.inflight == 0 {
			break
		}
		p.pauseIfFull()
	}
	p.markWatermark(true)
	p.w.eachWaiting(func(d *keyDelivery) { d.ctx.End() })
	p.wg.Wait()
	return p.stopErr
}

// stop ends reading: no record is handed over any more; deliveries in
// flight settle.
func (p *keyPartition) stop(err error) {
	if !p.stopping {
		p.stopping = true
		p.stopErr = err
		p.w.dropReadAhead()
	}
}

// admit moves the records read into the window while they fit.
func (p *keyPartition) admit() {
	n := 0
	for !p.stopping {
		d, ok := p.w.admitNext()
		if !ok {
			break
		}
		n++
		p.take(d)
	}
	if n > 0 && !p.stopping {
		p.w.publishReadAhead()
	}
}

// take enters d into the window and hands it over, or queues it behind
// its key.
func (p *keyPartition) take(d *keyDelivery) {
	if p.skip.has(d.off) {
		// An earlier owner completed it beyond its watermark.
		p.w.enter(d)
		p.finish(d)
		return
	}
	msg, err := p.h.s.unmarshal.Unmarshal(d.rec)
	if err != nil {
		// As watermill-kafka: a record that cannot be decoded stops the
		// partition until the next session; it is not committed.
		p.h.s.logger.Error("Cannot unmarshal a Kafka record, stopping the partition", err,
			p.h.logFields.Add(watermill.LogFields{"kafka_partition": p.partition, "kafka_partition_offset": d.off}))
		p.stop(fmt.Errorf("kafkabroker: message unmarshal failed: %w", err))
		return
	}
	p.w.enter(d)
	d.ctx = newDeliveryContext(p.h.ctx, d.rec, d)
	msg.SetContext(d.ctx)
	d.msg = msg
	if p.w.claimKey(d) {
		p.start(d)
	}
}

// finish marks d done: it leaves the window, and only its offset stays
// until the watermark passes it and is committed. The record's value and
// headers are let go (its other fields stay: the message's context and
// the tracker may still read them).
func (p *keyPartition) finish(d *keyDelivery) {
	p.w.finish(d)
	d.msg = nil
	d.rec.Value, d.rec.Headers = nil, nil
}

// start hands d over on a goroutine of its own.
func (p *keyPartition) start(d *keyDelivery) {
	p.inflight++
	p.wg.Add(1)
	go p.deliver(d)
}

// readReadyMax bounds the records readReady takes in one go, so that
// settling is not held up behind a long fetch.
const readReadyMax = 256

// readReady queues the records Sarama has ready without blocking, so a
// batch of records costs one pass of the loop rather than one each.
func (p *keyPartition) readReady(in <-chan *sarama.ConsumerMessage) {
	for range readReadyMax {
		select {
		case rec, ok := <-in:
			if !ok {
				p.stop(nil)
				return
			}
			p.readAhead(rec)
		default:
			return
		}
	}
}

// readAhead queues rec, read, in the window's read-ahead.
func (p *keyPartition) readAhead(rec *sarama.ConsumerMessage) {
	p.w.read(&keyDelivery{
		keyRecord: keyRecord{off: rec.Offset, key: string(rec.Key), size: recordSize(rec)},
		p:         p,
		rec:       rec,
	})
}

// report hands a delivery's outcome to the loop, waking it only when it
// has no batch pending already.
func (p *keyPartition) report(ev keyEvent) {
	p.reportMu.Lock()
	first := len(p.reports) == 0
	p.reports = append(p.reports, ev)
	p.reportMu.Unlock()
	if first {
		select {
		case p.settled <- struct{}{}:
		default:
		}
	}
}

// settleReady settles the deliveries that have reported, so the
// watermark is marked once for all of them.
func (p *keyPartition) settleReady() {
	p.reportMu.Lock()
	batch := p.reports
	p.reports = p.spare[:0]
	p.reportMu.Unlock()
	for i, ev := range batch {
		p.settle(ev)
		batch[i] = keyEvent{}
	}
	p.spare = batch[:0]
}

// settle records the outcome of a delivery and starts the next one of its
// key.
func (p *keyPartition) settle(ev keyEvent) {
	d := ev.d
	p.inflight--
	d.ctx.End()
	if !ev.done {
		// Abandoned: the session or subscription ended. The key stays
		// blocked; nothing after it is handed over.
		return
	}
	p.finish(d)
	if p.stopping {
		return
	}
	if next, ok := p.w.nextOfKey(d.key); ok {
		p.start(next)
	}
}

// markWatermark marks the offset after the contiguous completed records.
// The final mark also writes, in the commit's metadata, the records that
// completed beyond it: those this session finished, and those an earlier
// owner completed that this session has not read yet (p.skip from p.w.next
// on). Without the latter, a session that ends before reading as far as
// its predecessor did (a smaller window, a quick second rebalance) would
// drop them from the metadata, and the next owner would process them
// again.
func (p *keyPartition) markWatermark(final bool) {
	wm := p.w.watermark()
	if !final {
		if wm > p.lastMark {
			p.sess.MarkOffset(p.topic, p.partition, wm, "")
			p.lastMark = wm
			p.marked.Store(wm)
			ch := p.ks.nudge
			if p.w.commitUrgent() {
				ch = p.ks.urgent
			}
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		return
	}
	meta := encodeCompleted(wm, append(p.w.doneBeyond(), p.skip.from(p.w.next)...))
	if wm > p.lastMark {
		p.sess.MarkOffset(p.topic, p.partition, wm, meta)
	} else if meta != "" {
		// Same offset, new metadata: MarkOffset only moves forward.
		p.sess.ResetOffset(p.topic, p.partition, wm, meta)
	}
	p.lastMark = wm
	p.marked.Store(wm)
}

// pauseIfFull pauses fetching the partition when its read-ahead is full,
// and resumes it once the read-ahead is down to half of that
// (keyWindow.pauseChange).
func (p *keyPartition) pauseIfFull() {
	if p.stopping {
		return
	}
	pause, changed := p.w.pauseChange()
	if !changed {
		return
	}
	parts := map[string][]int32{p.topic: {p.partition}}
	if pause {
		p.h.group.Pause(parts)
	} else {
		p.h.group.Resume(parts)
	}
}

// deliver hands d over and waits for its ack, sending it again after a
// nack; then it reports to the partition's loop.
func (p *keyPartition) deliver(d *keyDelivery) {
	defer p.wg.Done()
	p.report(keyEvent{d: d, done: p.attempts(d)})
}

// attempts watches the session's and the subscription's channels, not
// d.ctx: until d settles, d.ctx ends only with the subscription's context,
// and asking it for its Done channel would build its cancellation
// (deliveryContext), per message.
func (p *keyPartition) attempts(d *keyDelivery) bool {
	msg := d.msg
	for {
		select {
		case p.h.out <- msg:
		case <-p.sessDone:
			return false // revoked before it was handed over
		case <-p.subDone:
			return false
		}
		select {
		case <-msg.Acked():
			return p.acked(d)
		case <-msg.Nacked():
			p.failed(d)
		case <-p.subDone:
			// The subscription is closing. An ack that came first still
			// counts: select picks at random among ready cases, and a
			// handler that acked just before Close would otherwise see
			// its finished work abandoned, redone by the next owner.
			select {
			case <-msg.Acked():
				return p.acked(d)
			default:
				return false
			}
		}
		if sleep := p.h.s.cfg.NackResendSleep; sleep > 0 {
			timer := time.NewTimer(sleep)
			select {
			case <-timer.C:
			case <-p.sessDone:
				timer.Stop()
				return false
			case <-p.subDone:
				timer.Stop()
				return false
			}
		}
		if p.sess.Context().Err() != nil {
			return false
		}
		msg = msg.Copy()
		msg.SetContext(d.ctx)
		d.completed.Store(false)
	}
}

// failed records that d's handler failed (nacked it), so that a later
// session of the cluster takes d's record for a redelivery
// ([SessionTracker.Redelivered]). Only a nack tells that a handler ran:
// a record that is revoked before it is handed over, or steps aside
// (acked after its session ended without completing) never ran, and the
// retry gate, which defers redeliveries under pressure, must treat it as
// fresh work. A handler that failed and then stepped aside while the
// retry gate waited to run it again is taken for fresh work too: the gate
// acks it, as any revoked waiter.
func (p *keyPartition) failed(d *keyDelivery) {
	p.h.s.keys.st.seen.fail(p.gp, d.off)
	p.failedNow.Store(true)
}

// acked reports whether d's ack counts: always while the session lives;
// after it ended (late), only for work this attempt completed, not for a
// message that stepped aside.
func (p *keyPartition) acked(d *keyDelivery) bool {
	if p.sess.Context().Err() != nil {
		if !d.completed.Load() {
			return false
		}
		p.h.s.keys.st.marked.Add(1)
	}
	return true
}

// keyDeliveryKey is the context key of a message's *keyDelivery.
type keyDeliveryKey struct{}

// deliveryOf returns the key-mode delivery msg belongs to, nil if none.
func deliveryOf(msg *message.Message) *keyDelivery {
	d, _ := msg.Context().Value(keyDeliveryKey{}).(*keyDelivery)
	return d
}
