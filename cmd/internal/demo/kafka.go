package demo

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
)

// kafkaVersion is the protocol version every client of the demo speaks:
// the newest that Sarama and kfake agree on (the router uses the
// same, see docs/kafka.md).
var kafkaVersion = sarama.V2_3_0_0

// cluster is an embedded, in-process Kafka broker (kfake) on loopback.
type cluster struct {
	kf      *kfake.Cluster
	brokers []string
}

func startCluster(partitions int, topics ...string) (*cluster, error) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(partitions), kfake.AllowAutoTopicCreation(),
		kfake.SeedTopics(int32(partitions), topics...))
	if err != nil {
		return nil, fmt.Errorf("demo: starting embedded Kafka: %w", err)
	}
	return &cluster{kf: kf, brokers: kf.ListenAddrs()}, nil
}

func (c *cluster) close() { c.kf.Close() }

// saramaCommon sets what every demo client shares with the router's:
// protocol version and a read timeout that outlasts a rebalance.
func saramaCommon(c *sarama.Config, deadline time.Duration) {
	c.Version = kafkaVersion
	if rt := deadline + 5*time.Second; c.Net.ReadTimeout < rt {
		c.Net.ReadTimeout = rt
	}
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
}

// marshaler keys every message by its entity, as the router does.
func marshaler() kafka.MarshalerUnmarshaler {
	return kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		if k := msg.Metadata.Get(MetaEntity); k != "" {
			return k, nil
		}
		return msg.UUID, nil
	})
}

// batchPublisher publishes a Publish call's messages in one produce
// request, keyed by entity, so the producer keeps up with the demo's rates
// without taking CPU from the consumers.
type batchPublisher struct {
	producer  sarama.SyncProducer
	marshaler kafka.Marshaler
}

func newBatchPublisher(brokers []string, deadline time.Duration) (*batchPublisher, error) {
	c := kafka.DefaultSaramaSyncPublisherConfig()
	saramaCommon(c, deadline)
	p, err := sarama.NewSyncProducer(brokers, c)
	if err != nil {
		return nil, fmt.Errorf("demo: producer: %w", err)
	}
	return &batchPublisher{producer: p, marshaler: marshaler()}, nil
}

func (p *batchPublisher) Publish(topic string, msgs ...*message.Message) error {
	batch := make([]*sarama.ProducerMessage, 0, len(msgs))
	for _, m := range msgs {
		km, err := p.marshaler.Marshal(topic, m)
		if err != nil {
			return err
		}
		batch = append(batch, km)
	}
	return p.producer.SendMessages(batch)
}

func (p *batchPublisher) Close() error { return p.producer.Close() }

// naiveSaramaConfig is the plain consumer's configuration: watermill-kafka's
// DefaultSaramaSubscriberConfig (Sarama's defaults), changed only where the
// comparison must be fair or the embedded broker needs it.
func naiveSaramaConfig(deadline, heartbeat time.Duration) *sarama.Config {
	c := kafka.DefaultSaramaSubscriberConfig()
	saramaCommon(c, deadline)
	// Fairness: the same redelivery deadline and heartbeat as Spillway's
	// consumer, and a fresh group reads the topic from its start.
	c.Consumer.Group.Rebalance.Timeout = deadline
	c.Consumer.Group.Heartbeat.Interval = heartbeat
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	return c
}

// observer is a watermill-kafka tracer that only watches consumer-group
// sessions: when each (member, group) consumer set up and ended a session,
// under which member id, and so how often it was evicted. It changes
// nothing, so it observes the plain consumer and the Spillway router alike
// (the router composes it with its own tracker).
type observer struct {
	member string
	onEv   func(SessionEvent)

	mu        sync.Mutex
	consumers []*observedHandler
}

// SessionEvent is one consumer-group session seen by the observer.
type SessionEvent struct {
	Member    string    `json:"member"` // the demo's member name (a, b)
	Topic     string    `json:"topic"`  // the topic the consumer reads
	MemberID  string    `json:"-"`
	Started   time.Time `json:"started"`
	Ended     time.Time `json:"ended"`
	Claims    int       `json:"claims"`
	Evicted   bool      `json:"evicted"` // came back under a new member id
	Rebalance bool      `json:"-"`
}

func (o *observer) WrapConsumer(c sarama.Consumer) sarama.Consumer { return c }
func (o *observer) WrapPartitionConsumer(pc sarama.PartitionConsumer) sarama.PartitionConsumer {
	return pc
}
func (o *observer) WrapSyncProducer(_ *sarama.Config, p sarama.SyncProducer) sarama.SyncProducer {
	return p
}

func (o *observer) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	oh := &observedHandler{o: o, next: h}
	o.mu.Lock()
	o.consumers = append(o.consumers, oh)
	o.mu.Unlock()
	return oh
}

// evictions counts, over every consumer of the member, the sessions that
// came back under a new member id.
func (o *observer) evictions() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, c := range o.consumers {
		c.mu.Lock()
		n += c.evicted
		c.mu.Unlock()
	}
	return n
}

// firstSession returns when the first session of a consumer of topic was
// set up, or zero.
func (o *observer) firstSession(topic string) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	var first time.Time
	for _, c := range o.consumers {
		c.mu.Lock()
		if c.topic == topic && !c.first.IsZero() && (first.IsZero() || c.first.Before(first)) {
			first = c.first
		}
		c.mu.Unlock()
	}
	return first
}

// sessionEndAfter returns when the first session of a consumer of topic
// that ended after t ended (the member learned of a rebalance), or zero.
func (o *observer) sessionEndAfter(topic string, t time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	var first time.Time
	for _, c := range o.consumers {
		c.mu.Lock()
		if c.topic == topic {
			for _, e := range c.ends {
				if e.After(t) && (first.IsZero() || e.Before(first)) {
					first = e
				}
			}
		}
		c.mu.Unlock()
	}
	return first
}

type observedHandler struct {
	o    *observer
	next sarama.ConsumerGroupHandler

	mu         sync.Mutex
	topic      string
	lastMember string
	first      time.Time
	ends       []time.Time // when each session's context ended
	evicted    int
}

func (h *observedHandler) Setup(s sarama.ConsumerGroupSession) error {
	now := time.Now()
	ev := SessionEvent{Member: h.o.member, MemberID: s.MemberID(), Started: now}
	for t, ps := range s.Claims() {
		if !strings.HasSuffix(t, ".retry") {
			ev.Topic = t
		}
		ev.Claims += len(ps)
	}
	h.mu.Lock()
	if ev.Topic != "" && h.topic == "" {
		h.topic = ev.Topic
	}
	if h.first.IsZero() {
		h.first = now
	}
	if h.lastMember != "" && h.lastMember != ev.MemberID {
		h.evicted++
		ev.Evicted = true
	}
	h.lastMember = ev.MemberID
	if ev.Topic == "" {
		ev.Topic = h.topic
	}
	h.mu.Unlock()
	if h.o.onEv != nil {
		h.o.onEv(ev)
	}
	go func() {
		<-s.Context().Done()
		h.mu.Lock()
		h.ends = append(h.ends, time.Now())
		h.mu.Unlock()
	}()
	return h.next.Setup(s)
}

func (h *observedHandler) Cleanup(s sarama.ConsumerGroupSession) error { return h.next.Cleanup(s) }

func (h *observedHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	return h.next.ConsumeClaim(s, c)
}

// lagReader computes consumer lag through Sarama's cluster admin: the high
// water mark minus the committed offset (from the oldest offset for a
// partition never committed), summed.
type lagReader struct {
	client sarama.Client
	admin  sarama.ClusterAdmin
}

func newLagReader(brokers []string, deadline time.Duration) (*lagReader, error) {
	c := sarama.NewConfig()
	saramaCommon(c, deadline)
	c.Net.ReadTimeout = 5 * time.Second
	client, err := sarama.NewClient(brokers, c)
	if err != nil {
		return nil, fmt.Errorf("demo: lag client: %w", err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("demo: lag admin: %w", err)
	}
	return &lagReader{client: client, admin: admin}, nil
}

// lag sums the lag of each group over its topic.
func (l *lagReader) lag(groups map[string]string) (int64, error) {
	var total int64
	for group, topic := range groups {
		parts, err := l.client.Partitions(topic)
		if err != nil {
			continue // not created yet (a retry topic)
		}
		resp, err := l.admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
		if err != nil {
			return 0, err
		}
		for _, p := range parts {
			hwm, err := l.client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return 0, err
			}
			committed := int64(-1)
			if b := resp.GetBlock(topic, p); b != nil {
				committed = b.Offset
			}
			if committed < 0 {
				if committed, err = l.client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
					return 0, err
				}
			}
			total += max(0, hwm-committed)
		}
	}
	return total, nil
}

func (l *lagReader) close() { _ = l.admin.Close() }

// recordingLogger counts the errors Sarama reports through watermill-kafka
// that mean a member lost its place in the group.
type recordingLogger struct {
	watermill.NopLogger
	mu     sync.Mutex
	lost   int
	errors int
}

func (l *recordingLogger) Error(msg string, err error, _ watermill.LogFields) {
	s := strings.ToLower(msg + ": " + fmt.Sprint(err))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errors++
	if strings.Contains(s, "unknown member") || strings.Contains(s, "illegal generation") ||
		strings.Contains(s, "not a current member") {
		l.lost++
	}
}

func (l *recordingLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *recordingLogger) counts() (lost, errors int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost, l.errors
}
