package retrygate

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Outcome is how one delivery of a message left the gate. Every delivery
// ends in exactly one outcome.
type Outcome uint8

const (
	// Handled: the handler chain returned nil, on the first attempt or a
	// retry, and the router acks (unless publishing the handler's produced
	// messages fails, which the router turns into a nack). A delivery that
	// budget admission stepped aside for (revoked) is handled too.
	Handled Outcome = iota
	// Deferred: the message was handed back for a later retry, either
	// republished to the retry topic (the original acked) or, with
	// DeferNack, nacked for the broker to redeliver.
	Deferred
	// DeadLettered: the message failed for good and was published to the
	// dead-letter topic; the original is acked.
	DeadLettered
	// Nacked: the message could not be finished here and is nacked for
	// redelivery: its context ended, a publish to the retry or dead-letter
	// topic failed, or the handler panicked.
	Nacked
)

var outcomeNames = [...]string{Handled: "handled", Deferred: "deferred", DeadLettered: "dead_lettered", Nacked: "nacked"}

// String returns "handled", "deferred", "dead_lettered" or "nacked".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", o)
}

// Cause is why a delivery ended in its outcome.
type Cause uint8

const (
	// CauseNone: the message was handled.
	CauseNone Cause = iota
	// CauseSaturated: the handler failed while the consumer was saturated,
	// so the message was deferred rather than retried in process.
	CauseSaturated
	// CauseSaturatedOnArrival: a redelivered message arrived while the
	// consumer was saturated and was deferred without running the handler.
	CauseSaturatedOnArrival
	// CauseRetryBudget: the retry budget had no token for the retry.
	CauseRetryBudget
	// CauseMaxElapsed: the next backoff wait would have ended past
	// Config.MaxElapsedTime.
	CauseMaxElapsed
	// CausePermanent: the error was classified permanent.
	CausePermanent
	// CauseAttemptsExhausted: the message failed Config.MaxAttempts times.
	CauseAttemptsExhausted
	// CauseContextDone: the message context ended (router or subscriber
	// shutting down) during an attempt or a wait, or the handler chain
	// returned context.Canceled.
	CauseContextDone
	// CausePublishFailed: publishing to the retry or dead-letter topic
	// failed.
	CausePublishFailed
	// CausePanic: the handler panicked; the panic is passed on unchanged.
	CausePanic
)

var causeNames = [...]string{
	CauseNone:               "none",
	CauseSaturated:          "saturated",
	CauseSaturatedOnArrival: "saturated_on_arrival",
	CauseRetryBudget:        "retry_budget",
	CauseMaxElapsed:         "max_elapsed",
	CausePermanent:          "permanent",
	CauseAttemptsExhausted:  "attempts_exhausted",
	CauseContextDone:        "context_done",
	CausePublishFailed:      "publish_failed",
	CausePanic:              "panic",
}

// String returns the cause in snake case, e.g. "retry_budget".
func (c Cause) String() string {
	if int(c) < len(causeNames) {
		return causeNames[c]
	}
	return fmt.Sprintf("Cause(%d)", c)
}

// Event describes one delivery's passage through the gate.
type Event struct {
	// Message is the delivered message, its context the delivery's again
	// (what the gate received). It is only valid during the call that
	// reports the event: do not keep it, and do not ack or nack it.
	Message *message.Message

	Topic   string // the topic it was consumed from
	Handler string // the Watermill handler name

	Outcome Outcome
	Cause   Cause

	// Redelivered: the delivery was a retry (attempt count in metadata or
	// Options.IsRedelivery).
	Redelivered bool
	// Attempts is the message's attempt count when the delivery ended:
	// handler runs over its whole life so far.
	Attempts int
	// Retries is the number of in-process retries in this delivery.
	Retries int
	// Destination is the topic the message was published to: the retry
	// topic (Deferred with DeferRepublish) or the dead-letter topic
	// (DeadLettered). Empty otherwise, also when the publish failed.
	Destination string
	// Err is the handler's last error; for CausePublishFailed, the publish
	// error. Nil when handled or deferred on arrival.
	Err error
	// Elapsed is the time the delivery spent in the gate.
	Elapsed time.Duration
}

// Counts are counters of deliveries by outcome, plus retry activity.
// Handled + Deferred + DeadLettered + Nacked is the number of deliveries
// that have left the gate.
type Counts struct {
	Handled      uint64
	Deferred     uint64
	DeadLettered uint64
	Nacked       uint64

	// Retries counts in-process retries: handler runs after the first in
	// one delivery.
	Retries uint64
	// DeferredOnArrival counts the Deferred deliveries that were
	// redelivered work shed on arrival without running the handler.
	DeferredOnArrival uint64
	// RetryBudgetDenied counts retries refused for lack of a token; each
	// ended in a deferral.
	RetryBudgetDenied uint64
}

// deliveries returns Handled + Deferred + DeadLettered + Nacked.
func (c Counts) deliveries() uint64 { return c.Handled + c.Deferred + c.DeadLettered + c.Nacked }

// Stats is a snapshot of a gate's counters.
type Stats struct {
	Counts                   // over all topics
	Topics map[string]Counts // by consumed topic

	// RetryTokens is the number of retries the budget would grant now
	// (+Inf when it is unlimited).
	RetryTokens float64
}

type counters struct {
	handled, deferred, deadLettered, nacked atomic.Uint64
	retries, onArrival, budgetDenied        atomic.Uint64
}

func (c *counters) snapshot() Counts {
	return Counts{
		Handled:           c.handled.Load(),
		Deferred:          c.deferred.Load(),
		DeadLettered:      c.deadLettered.Load(),
		Nacked:            c.nacked.Load(),
		Retries:           c.retries.Load(),
		DeferredOnArrival: c.onArrival.Load(),
		RetryBudgetDenied: c.budgetDenied.Load(),
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

func (t *topicCounters) snapshot() (Counts, map[string]Counts) {
	var total Counts
	byTopic := make(map[string]Counts)
	t.m.Range(func(k, v any) bool {
		c := v.(*counters).snapshot()
		byTopic[k.(string)] = c
		total.Handled += c.Handled
		total.Deferred += c.Deferred
		total.DeadLettered += c.DeadLettered
		total.Nacked += c.Nacked
		total.Retries += c.Retries
		total.DeferredOnArrival += c.DeferredOnArrival
		total.RetryBudgetDenied += c.RetryBudgetDenied
		return true
	})
	return total, byTopic
}
