package demo

import (
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/retrygate"
	"github.com/spillway-go/spillway/router"
)

// brokerEnv is a fresh broker for one group's run and what the demo needs
// from it: a producer, the plain consumer's subscribers, the Spillway
// router's configuration, and lag.
type brokerEnv interface {
	// publisher is the producer's raw publisher; the demo stamps it.
	publisher() message.Publisher
	// naiveSubscriber is the plain consumer's subscriber of topic for m.
	naiveSubscriber(m *member, topic string) (message.Subscriber, error)
	// spillwayConfig sets the router's broker section for m.
	spillwayConfig(cfg *router.Config, m *member)
	// routerOptions are extra options for m's router.
	routerOptions(m *member) []router.Option
	// lag sums the uncommitted (Kafka) or undelivered plus pending
	// (Redis) messages of the group's handlers.
	lag(group string) (int64, error)
	// sessions says whether consumers have group sessions, so a joining
	// member forces a rebalance (Kafka), or not (Redis Streams, where a
	// joining member claims idle entries instead).
	sessions() bool
	close()
}

// kafkaEnv is an embedded kfake cluster.
type kafkaEnv struct {
	o   Options
	cl  *cluster
	pub *batchPublisher
	lr  *lagReader
}

func newKafkaEnv(o Options) (*kafkaEnv, error) {
	cl, err := startCluster(o.Partitions, TopicPositions, TopicBoundaries)
	if err != nil {
		return nil, err
	}
	e := &kafkaEnv{o: o, cl: cl}
	if e.pub, err = newBatchPublisher(cl.brokers, o.Deadline); err != nil {
		e.close()
		return nil, err
	}
	if e.lr, err = newLagReader(cl.brokers, o.Deadline); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *kafkaEnv) publisher() message.Publisher { return e.pub }

func (e *kafkaEnv) naiveSubscriber(m *member, topic string) (message.Subscriber, error) {
	return kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               e.cl.brokers,
		Unmarshaler:           marshaler(),
		OverwriteSaramaConfig: naiveSaramaConfig(e.o.Deadline, e.o.Heartbeat),
		ConsumerGroup:         GroupNaive + "." + topic,
		Tracer:                m.obs,
	}, m.logger)
}

func (e *kafkaEnv) spillwayConfig(cfg *router.Config, _ *member) {
	cfg.Broker = "kafka"
	k := &cfg.Kafka
	k.Brokers = e.cl.brokers
	k.Version = kafkaVersion.String() // kfake's limit; the router defaults to 3.6.0
	k.CreateTopics = true
	k.ConsumerGroup = GroupSpillway
	k.Partitions = int32(e.o.Partitions)
	k.RebalanceTimeout = e.o.Deadline
	k.HeartbeatInterval = e.o.Heartbeat
	k.KeyMetadata = MetaEntity
}

func (e *kafkaEnv) routerOptions(m *member) []router.Option {
	return []router.Option{router.WithKafka(kafkabroker.WithTracer(m.obs))}
}

func (e *kafkaEnv) lag(group string) (int64, error) {
	spillway := isSpillway(group)
	if group == GroupSingleLane {
		group = GroupSpillway // the consumer group prefix of both lane runs
	}
	groups := map[string]string{}
	for _, t := range []string{TopicPositions, TopicBoundaries} {
		groups[group+"."+t] = t
		if spillway {
			// the router names the retry handler of handler t "<t>.retry"
			groups[group+"."+t+".retry"] = retrygate.Config{}.RetryTopicFor(t)
		}
	}
	return e.lr.lag(groups)
}

func (e *kafkaEnv) sessions() bool { return true }

func (e *kafkaEnv) close() {
	if e.lr != nil {
		e.lr.close()
	}
	if e.pub != nil {
		_ = e.pub.Close()
	}
	e.cl.close()
}

// newEnv starts the broker o names.
func newEnv(o Options) (brokerEnv, error) {
	if o.Broker == "redis" {
		return newRedisEnv(o)
	}
	return newKafkaEnv(o)
}

// lagTimeout bounds one lag reading.
const lagTimeout = 2 * time.Second
