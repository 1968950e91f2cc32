package redisbroker

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

// ackRetry is how long the acker waits before sending again a batch that
// failed (Redis unreachable…), as upstream waits between XACK attempts.
const ackRetry = 100 * time.Millisecond

// ackBatch bounds the entries acknowledged by one script call, so one call
// never holds the server for long.
const ackBatch = 256

// ackReq is one entry a consumer asked to acknowledge.
type ackReq struct {
	sub                  *subscription
	stream, consumer, id string
}

// acker sends the acknowledgements of a Subscriber's consumers to Redis from
// one goroutine, so that a consumer does not wait for the owner-checked ack
// round trip before it hands over its next message. Acks that arrive while
// a script call is in flight go out together in the next one (one call per
// stream), so under load several entries share a round trip.
//
// An entry stays tracked by the keep-alive, and so kept alive and owned,
// until its ack has reached Redis: the ack script still checks, atomically,
// that the consumer owns the entry, and [keepAlive.mayAck] is asked when
// the batch is sent. Close sends whatever is still queued before the
// subscriber's clients close.
type acker struct {
	client redis.UniversalClient // the subscriber's control client
	group  string
	ka     *keepAlive
	acks   *ackTable
	logger watermill.LoggerAdapter

	mu    sync.Mutex
	queue []ackReq

	wake chan struct{} // one pending wake-up
	stop chan struct{}
	done chan struct{}
	// flushErr is the last error of the final flush, read after done.
	flushErr error
	// flushTimeout bounds the final flush.
	flushTimeout time.Duration
}

func newAcker(client redis.UniversalClient, group string, ka *keepAlive, acks *ackTable, logger watermill.LoggerAdapter) *acker {
	a := &acker{
		client:       client,
		group:        group,
		ka:           ka,
		acks:         acks,
		logger:       logger,
		wake:         make(chan struct{}, 1),
		stop:         make(chan struct{}),
		done:         make(chan struct{}),
		flushTimeout: 5 * time.Second,
	}
	go a.run()
	return a
}

// enqueue queues ids of stream, delivered to consumer for sub, for
// acknowledgement.
func (a *acker) enqueue(sub *subscription, stream, consumer string, ids ...string) {
	a.mu.Lock()
	for _, id := range ids {
		a.queue = append(a.queue, ackReq{sub: sub, stream: stream, consumer: consumer, id: id})
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// close stops the acker once it has sent what is queued (giving up after
// flushTimeout), and returns the error of that last flush, if any.
func (a *acker) close() error {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	<-a.done
	return a.flushErr
}

func (a *acker) run() {
	defer close(a.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		select {
		case <-a.wake:
		case <-a.stop:
			fctx, fcancel := context.WithTimeout(context.Background(), a.flushTimeout)
			a.flushErr = a.flushAll(fctx)
			fcancel()
			return
		}
		if err := a.flush(ctx); err != nil {
			// Failed entries are back in the queue: try again later,
			// or in the final flush.
			select {
			case <-time.After(ackRetry):
				a.poke()
			case <-a.stop:
				a.poke()
			}
		}
	}
}

func (a *acker) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// flushAll sends until the queue is empty or ctx ends.
func (a *acker) flushAll(ctx context.Context) error {
	for {
		err := a.flush(ctx)
		a.mu.Lock()
		empty := len(a.queue) == 0
		a.mu.Unlock()
		if empty {
			return nil
		}
		if ctx.Err() != nil {
			if err == nil {
				err = ctx.Err()
			}
			return err
		}
		if err != nil {
			select {
			case <-time.After(ackRetry):
			case <-ctx.Done():
			}
		}
	}
}

// flush sends what is queued now, one script call per stream and batch.
// Entries of a batch that failed go back to the queue; it returns the
// first error.
func (a *acker) flush(ctx context.Context) error {
	a.mu.Lock()
	todo := a.queue
	a.queue = nil
	a.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	var first error
	var failed []ackReq
	for len(todo) > 0 {
		// One stream per call: take the run of requests on todo[0]'s
		// stream (consumers ack one stream at a time in practice).
		stream := todo[0].stream
		batch, rest := todo, []ackReq(nil)
		if !oneBatch(todo) {
			batch = nil
			for _, r := range todo {
				if r.stream == stream && len(batch) < ackBatch {
					batch = append(batch, r)
				} else {
					rest = append(rest, r)
				}
			}
		}
		todo = rest
		if err := a.send(ctx, stream, batch); err != nil {
			if first == nil {
				first = err
			}
			failed = append(failed, batch...)
		}
	}
	if len(failed) > 0 {
		a.mu.Lock()
		a.queue = append(failed, a.queue...)
		a.mu.Unlock()
		if ctx.Err() == nil {
			a.logger.Error("Acknowledging entries failed; retrying", first, watermill.LogFields{"entries": len(failed)})
		}
	}
	return first
}

// send acknowledges batch (all on stream) with ackScript, leaving out the
// entries the keep-alive says must not be acknowledged, then records the
// progress.
func (a *acker) send(ctx context.Context, stream string, batch []ackReq) error {
	args := make([]any, 0, 1+2*len(batch))
	args = append(args, a.group)
	for _, r := range batch {
		if a.ka.mayAck(kaKey{stream: stream, id: r.id, consumer: r.consumer}) {
			args = append(args, r.consumer, r.id)
		}
	}
	if len(args) > 1 {
		if err := ackScript.Run(ctx, a.client, []string{stream}, args...).Err(); err != nil {
			return err
		}
	}
	for _, r := range batch {
		a.ka.forget(r.sub, stream, r.consumer, r.id)
		a.acks.xacked(stream, r.consumer, r.id)
	}
	return nil
}

// oneBatch reports whether reqs fit in one script call: one stream, at
// most ackBatch entries (the usual case, with no copy needed).
func oneBatch(reqs []ackReq) bool {
	if len(reqs) > ackBatch {
		return false
	}
	for _, r := range reqs[1:] {
		if r.stream != reqs[0].stream {
			return false
		}
	}
	return true
}
