package retrygate

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Outcome is how one delivery of a message left the gate. Every delivery
// ends in exactly one outcome. Its value is the snake-case name, the one
// logs and metric labels use.
type Outcome string

const (
	// Handled: the handler chain returned nil, on the first attempt or a
	// retry, and the router acks (unless publishing the handler's produced
	// messages fails, which the router turns into a nack). A delivery that
	// budget admission stepped aside for (revoked) is handled too.
	Handled Outcome = "handled"
	// Deferred: the message was handed back for a later retry, either
	// republished to the retry topic (the original acked) or, with
	// DeferNack, nacked for the broker to redeliver; or, revoked while it
	// waited in the gate ([WithRevoked]), acked without running again
	// and left, uncommitted, to the next owner.
	Deferred Outcome = "deferred"
	// DeadLettered: the message failed for good and was published to the
	// dead-letter topic; the original is acked.
	DeadLettered Outcome = "dead_lettered"
	// Nacked: the message could not be finished here and is nacked for
	// redelivery: its context ended, a publish to the retry or dead-letter
	// topic failed, or the handler panicked.
	Nacked Outcome = "nacked"
)

// Causes: why a delivery ended in its outcome ([Event.Cause]). They are
// the reason labels of the spillway.messages.deferred and .dead_lettered
// metrics, and a dead-letter copy's [DeadLetterCauseKey] is one of them.
const (
	// causeNone: the message was handled.
	causeNone = ""
	// causeSaturated: the handler failed while the consumer was saturated,
	// so the message was deferred rather than retried in process.
	causeSaturated = "saturated"
	// causeSaturatedOnArrival: a redelivered message arrived while the
	// consumer was saturated and was deferred without running the handler.
	causeSaturatedOnArrival = "saturated_on_arrival"
	// causeRetryBudget: the retry budget had no token for the retry.
	causeRetryBudget = "retry_budget"
	// causeMaxElapsed: the next backoff wait would have ended past
	// Config.MaxElapsedTime.
	causeMaxElapsed = "max_elapsed"
	// causeRevoked: the delivery was revoked (its Kafka session ended, a
	// peer claimed its Redis entry) while it waited in the gate.
	causeRevoked = "revoked"
	// causeMalformed: the handler's error says the payload cannot be
	// decoded ([cost.IsUndecodable]): dead-lettered at once, whatever
	// the classifier ([WithIsPermanent]) says.
	causeMalformed = "malformed"
	// causePermanent: the error was classified permanent.
	causePermanent = "permanent"
	// causeAttemptsExhausted: the message failed Config.MaxAttempts times.
	causeAttemptsExhausted = "attempts_exhausted"
	// causeContextDone: the message context ended (router or subscriber
	// shutting down) during an attempt or a wait, or the handler chain
	// returned context.Canceled.
	causeContextDone = "context_done"
	// causePublishFailed: publishing to the retry or dead-letter topic
	// failed.
	causePublishFailed = "publish_failed"
	// causePanic: the handler panicked; the panic is passed on unchanged.
	causePanic = "panic"
)

// Event describes one delivery's passage through the gate, as the hook
// set by [WithOnOutcome] receives it.
type Event struct {
	// Message is the delivered message, its context the delivery's again
	// (what the gate received). It is only valid during the call that
	// reports the event: do not keep it, and do not ack or nack it.
	Message *message.Message

	// Topic is the topic it was consumed from.
	Topic string

	// Outcome is how the delivery left the gate.
	Outcome Outcome

	// Cause is why the delivery ended in its outcome, in snake case: empty
	// when handled; "saturated", "saturated_on_arrival", "retry_budget",
	// "max_elapsed" or "revoked" when deferred; "malformed", "permanent"
	// or "attempts_exhausted" when dead-lettered; "context_done",
	// "publish_failed" or "panic" when nacked (a failed publish nacks
	// whatever the cause was going to be). It is the reason label of the
	// spillway.messages.deferred and .dead_lettered metrics.
	Cause string

	// Err is the handler's last error; for the "publish_failed" cause, the
	// publish error. Nil when handled or deferred on arrival.
	Err error

	// Read by the package's tests: the attempt count when the delivery
	// ended, whether the delivery was a retry, its in-process retries, the
	// topic it was published to and its time in the gate.
	attempts    int
	redelivered bool
	retries     int
	destination string
	elapsed     time.Duration
}

// Stats is a snapshot of a gate's counters over all topics. Handled +
// Deferred + DeadLettered + Nacked is the number of deliveries that have
// left the gate. The spillway.messages.deferred and .dead_lettered metrics
// break the deferrals and dead-letters down by topic and cause.
type Stats struct {
	// Handled counts the deliveries that ended handled.
	Handled uint64
	// Deferred counts the deliveries handed back for a later retry.
	Deferred uint64
	// DeadLettered counts the deliveries published to a dead-letter topic.
	DeadLettered uint64
	// Nacked counts the deliveries nacked for redelivery.
	Nacked uint64

	// Retries counts in-process retries: handler runs after the first in
	// one delivery.
	Retries uint64

	// Revoked counts the deliveries that stepped aside while they waited
	// in the gate ([WithRevoked]); they are among Deferred.
	Revoked uint64

	// RetryTokens is the number of retries the budget would grant now
	// (+Inf when it is unlimited).
	RetryTokens float64
}

// counts are the counters of one topic, or of all of them summed. The
// by-topic and by-cause breakdown is left to the metrics; the package's
// tests read it here.
type counts struct {
	handled, deferred, deadLettered, nacked uint64
	retries, onArrival, budgetDenied        uint64
	revoked                                 uint64
}

type counters struct {
	handled, deferred, deadLettered, nacked atomic.Uint64
	retries, onArrival, budgetDenied        atomic.Uint64
	revoked                                 atomic.Uint64
}

func (c *counters) snapshot() counts {
	return counts{
		handled:      c.handled.Load(),
		deferred:     c.deferred.Load(),
		deadLettered: c.deadLettered.Load(),
		nacked:       c.nacked.Load(),
		retries:      c.retries.Load(),
		onArrival:    c.onArrival.Load(),
		budgetDenied: c.budgetDenied.Load(),
		revoked:      c.revoked.Load(),
	}
}

// topicCounters keeps one counters per topic; created on first use.
type topicCounters struct {
	m sync.Map // string -> *counters
}

func (t *topicCounters) get(topic string) *counters {
	if c, ok := t.m.Load(topic); ok {
		return c.(*counters)
	}
	c, _ := t.m.LoadOrStore(topic, new(counters))
	return c.(*counters)
}

// snapshot returns the counters summed over all topics.
func (t *topicCounters) snapshot() counts {
	var total counts
	t.m.Range(func(_, v any) bool {
		c := v.(*counters).snapshot()
		total.handled += c.handled
		total.deferred += c.deferred
		total.deadLettered += c.deadLettered
		total.nacked += c.nacked
		total.retries += c.retries
		total.onArrival += c.onArrival
		total.budgetDenied += c.budgetDenied
		total.revoked += c.revoked
		return true
	})
	return total
}

// topic returns one topic's counters (zero if it has none).
func (t *topicCounters) topic(name string) counts {
	if c, ok := t.m.Load(name); ok {
		return c.(*counters).snapshot()
	}
	return counts{}
}
