package router

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
)

// Watermill's LoggerAdapter has no warning level (Error, Info, Debug,
// Trace), so the router's warnings are Info lines whose message starts
// with "spillway: warning:", and whose fields say what they are about.

// topicNotices limits a log line to one per topic and interval: the first
// event of a topic is logged; later ones are counted, and the next event
// once every has passed since the last line is logged with that count.
// With every 0 only the first event of each topic is ever logged. Its zero
// value is ready to use; it is safe for concurrent use. It holds one entry
// per topic, and a router consumes a bounded set of topics.
type topicNotices struct {
	mu     sync.Mutex
	every  time.Duration
	topics map[string]*topicNotice
}

type topicNotice struct {
	last       time.Time // when the last line was logged
	suppressed int64     // events since then that were not logged
}

// note records an event of topic at now. It reports whether to log it and,
// if so, how many events of the topic were not logged since the last line.
func (n *topicNotices) note(topic string, now time.Time) (logIt bool, suppressed int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, seen := n.topics[topic]
	if !seen {
		if n.topics == nil {
			n.topics = make(map[string]*topicNotice)
		}
		n.topics[topic] = &topicNotice{last: now}
		return true, 0
	}
	if n.every <= 0 || now.Sub(e.last) < n.every {
		e.suppressed++
		return false, 0
	}
	suppressed = e.suppressed
	e.last, e.suppressed = now, 0
	return true, suppressed
}

// setEvery changes the interval of n (tests shorten it).
func (n *topicNotices) setEvery(every time.Duration) {
	n.mu.Lock()
	n.every = every
	n.mu.Unlock()
}

// oversizeLogEvery is how often at most the router logs, per topic, that
// it refuses oversize messages.
const oversizeLogEvery = time.Minute

// unstamped notes an admission whose charge was not read from a
// vertex_count header: counted for [Router.Stats] when admitted, and, for
// a charge of the default cost, the first of its topic logged. Called by
// the admission hook for a source other than the header only.
func (r *Router) unstamped(msg *message.Message, a *middleware.Admission) {
	src := a.Charge.Source
	switch a.Result {
	case middleware.Oversize:
		// Refused, not charged (a payload refused before it was priced
		// has no source of its own): the oversize line says so.
		return
	case middleware.Admitted:
		if src == cost.SourceComputed {
			r.computed.Add(1)
		} else {
			r.defaulted.Add(1)
		}
	}
	if src != cost.SourceMissing && src != cost.SourceMalformed {
		return
	}
	topic := r.originTopic(msg)
	if logIt, _ := r.unstampedLog.note(topic, time.Time{}); logIt {
		r.warnDefaulted(topic, src, a.Charge.Vertices)
	}
}

// warnDefaulted logs that messages of topic are charged the default cost
// (charge vertices) because their vertex_count is missing or malformed.
func (r *Router) warnDefaulted(topic string, src cost.Source, charge int64) {
	capacity := r.budget.Capacity()
	what := "carry no " + cost.MetadataKey
	if src == cost.SourceMalformed {
		what = "carry a malformed " + cost.MetadataKey
	}
	builtin := r.opts.estimator == nil
	if builtin && r.cfg.Budget.ComputeMissing {
		what += " and budget.compute_missing cannot count their payload"
	}
	var charged string
	if charge >= capacity {
		charged = fmt.Sprintf("the default cost, the whole budget (%d vertices), so they run one at a time", capacity)
		charge = capacity
	} else {
		charged = fmt.Sprintf("the default cost of %d vertices of the %d-vertex budget", charge, capacity)
	}
	todo := "stamp them at ingest (cost.NewStampingPublisher)"
	if builtin && !r.cfg.Budget.ComputeMissing {
		todo += " or set budget.compute_missing"
	}
	r.logger.Info(fmt.Sprintf("spillway: warning: messages on topic %q %s; each is charged %s: %s",
		topic, what, charged, todo), watermill.LogFields{
		"topic": topic, "source": src.String(), "charge": charge, "budget": capacity,
	})
}

// warnOversize logs, at most once per topic and oversizeLogEvery, that the
// budget refused msg, consumed from topic origin, as oversize and that it
// went to topic to.
func (r *Router) warnOversize(msg *message.Message, a middleware.Admission, origin, to string) {
	logIt, suppressed := r.oversizeLog.note(origin, time.Now())
	if !logIt {
		return
	}
	b := r.cfg.Budget
	field, limit, size := "budget.max_message_vertices", b.MaxMessageVertices, a.Charge.Vertices
	what := fmt.Sprintf("a charge of %d vertices", size)
	if n := len(msg.Payload); b.MaxPayloadBytes > 0 && int64(n) > b.MaxPayloadBytes {
		field, limit, size = "budget.max_payload_bytes", b.MaxPayloadBytes, int64(n)
		what = fmt.Sprintf("a payload of %d bytes", n)
	}
	var went, todo string
	if b.OversizeTopic != "" {
		went = fmt.Sprintf("they go to budget.oversize_topic %q", to)
		todo = "raise " + field + " if they should run here"
	} else {
		went = fmt.Sprintf("they are dead-lettered to %q", to)
		todo = "raise " + field + ", or set budget.oversize_topic to process them elsewhere"
	}
	line := fmt.Sprintf("spillway: warning: messages on topic %q are refused as oversize (%s, above %s %d); %s: %s",
		origin, what, field, limit, went, todo)
	if suppressed > 0 {
		line += " (" + strconv.FormatInt(suppressed, 10) + " more refused since the last such line)"
	}
	r.logger.Info(line, watermill.LogFields{
		"topic": origin, "limit": field, "limit_value": limit, "value": size, "to": to, "suppressed": suppressed,
	})
}
