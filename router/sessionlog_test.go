package router

import (
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
)

// sessionLog is a Sarama tracer (give it to a router with
// WithKafka(kafkabroker.WithTracer(...))) that records the consumer-group sessions claiming
// partitions of topic: when each was set up, when its context ended (a
// rebalance or close) and when it was released (every claim returned).
// Sessions of other groups the router runs, such as the retry handler's,
// claim other topics and are left out.
type sessionLog struct {
	topic string

	mu     sync.Mutex
	events []sessionEvent
}

// sessionEvent is one session seen by a sessionLog; ended and released
// are zero while the session lives.
type sessionEvent struct {
	started, ended, released time.Time
}

var _ kafka.SaramaTracer = (*sessionLog)(nil)

func newSessionLog(topic string) *sessionLog { return &sessionLog{topic: topic} }

// sessions returns the sessions seen so far, oldest first.
func (l *sessionLog) sessions() []sessionEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]sessionEvent(nil), l.events...)
}

// update changes the event at i.
func (l *sessionLog) update(i int, f func(*sessionEvent)) {
	l.mu.Lock()
	f(&l.events[i])
	l.mu.Unlock()
}

func (l *sessionLog) WrapConsumer(c sarama.Consumer) sarama.Consumer { return c }

func (l *sessionLog) WrapPartitionConsumer(pc sarama.PartitionConsumer) sarama.PartitionConsumer {
	return pc
}

func (l *sessionLog) WrapSyncProducer(_ *sarama.Config, p sarama.SyncProducer) sarama.SyncProducer {
	return p
}

func (l *sessionLog) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	return &loggedHandler{ConsumerGroupHandler: h, log: l, index: make(map[sarama.ConsumerGroupSession]int)}
}

// loggedHandler records the sessions of one consumer group handler.
type loggedHandler struct {
	sarama.ConsumerGroupHandler
	log *sessionLog

	mu    sync.Mutex
	index map[sarama.ConsumerGroupSession]int // the session's event in log
}

func (h *loggedHandler) Setup(s sarama.ConsumerGroupSession) error {
	if _, ok := s.Claims()[h.log.topic]; ok {
		l := h.log
		l.mu.Lock()
		l.events = append(l.events, sessionEvent{started: time.Now()})
		i := len(l.events) - 1
		l.mu.Unlock()
		h.mu.Lock()
		h.index[s] = i
		h.mu.Unlock()
		go func() {
			<-s.Context().Done()
			l.update(i, func(e *sessionEvent) { e.ended = time.Now() })
		}()
	}
	return h.ConsumerGroupHandler.Setup(s)
}

func (h *loggedHandler) Cleanup(s sarama.ConsumerGroupSession) error {
	err := h.ConsumerGroupHandler.Cleanup(s)
	h.mu.Lock()
	i, ok := h.index[s]
	delete(h.index, s)
	h.mu.Unlock()
	if ok {
		h.log.update(i, func(e *sessionEvent) { e.released = time.Now() })
	}
	return err
}
