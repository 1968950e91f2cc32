package router

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/telemetry"
)

// backend is the seam between the router and a broker: memory, Kafka
// (kafka.go) and Redis Streams (redis.go). Adding a broker means one more
// implementation and one more case in newRouter; handlers and the
// middleware stack do not change.
type backend interface {
	// publisher is the broker's raw publisher; the router stamps and
	// closes it.
	publisher() message.Publisher
	// subscriber returns the subscriber for one handler, and the tracker
	// that makes its admission revocation-aware (nil if the broker has no
	// revocable deliveries).
	subscriber(handler, topic string) (message.Subscriber, deliveryTracker, error)
	// group is the consumer group the broker really uses for the
	// handler named handler; "" if the broker has no consumer groups.
	group(handler string) string
	// ensureTopic makes topic exist, where the broker needs that.
	ensureTopic(topic string) error
	// lag reads the uncommitted messages of the handlers' groups, one
	// sample per partition (Kafka) or stream (Redis); ErrLagUnknown when
	// the broker cannot tell.
	lag(ctx context.Context, groups []groupTopic) ([]telemetry.LagSample, error)
	// estimateBacklog estimates the vertices of each lag sample's
	// messages, in order, a message without a valid vertex_count at
	// unstamped vertices; ErrLagUnknown when the broker cannot tell.
	estimateBacklog(ctx context.Context, samples []telemetry.LagSample, unstamped int64) ([]vertexEstimate, error)
	// deadLetter is the middleware that takes messages the broker could
	// not decode (or delivered too often) out of the flow, outside the
	// budget; nil if there are none. moved, if not nil, is called after
	// each message it moved, with whether the message was malformed.
	deadLetter(moved func(msg *message.Message, malformed bool)) message.HandlerMiddleware
	// system is the messaging.system attribute of spans.
	system() string
	// redelivered reports whether msg is a broker redelivery; tr is the
	// tracker of the handler that received it, nil if it has none.
	redelivered(msg *message.Message, tr deliveryTracker) bool
	// useCopies hands the backend the router's publisher for copies
	// (traced, not counted) once it exists, for what the backend
	// publishes itself (Redis dead letters).
	useCopies(p message.Publisher)
	// addStats adds the broker's own counters to s.
	addStats(s *Stats)
	// keepAlive sums the keep-alive counters of the open subscribers;
	// false where the broker has no keep-alive (all but Redis).
	keepAlive() (redisbroker.SubscriberStats, bool)
	// keyWindows calls f with each handler's consumer group and session
	// tracker when the broker is Kafka in consumer key; otherwise never.
	keyWindows(f func(group string, kt *kafkabroker.SessionTracker))
	// owned returns the samples of the partitions this process consumes
	// now (Kafka: those the group assigned to it), all of them where every
	// member consumes everything (Redis streams). The lag sampler
	// estimates the backlog of these only, so that a fleet of N processes
	// reads each partition about once, not N times.
	owned(samples []telemetry.LagSample) []telemetry.LagSample
	// started tells the backend that Run has started (its subscribers
	// are about to subscribe).
	started()
	// close releases what the backend owns, after the router and the
	// publisher are closed.
	close() error
}

// deliveryTracker makes budget admission revocation-aware for one
// handler's subscriber: a Kafka session ([kafkabroker.SessionTracker]) or
// a Redis entry's ownership ([redisbroker.Subscriber.Revoked]). The budget
// waits on Revoked; the shutdown gate calls Begin before admission and the
// admitted layer Completed when the handler succeeds.
type deliveryTracker interface {
	Revoked(msg *message.Message) <-chan struct{}
	Begin(msg *message.Message)
	Completed(msg *message.Message)
	// Redelivered reports whether the broker delivered msg before.
	Redelivered(msg *message.Message) bool
}

var _ deliveryTracker = (*kafkabroker.SessionTracker)(nil)

// memoryBackend is Watermill's GoChannel, persistent: a subscriber
// receives everything published to its topic, also before it subscribed.
// There are no consumer groups and no sessions; every subscriber gets every
// message, and a message is redelivered only when nacked.
type memoryBackend struct {
	noExtras
	ch *gochannel.GoChannel
}

func newMemoryBackend(logger watermill.LoggerAdapter) *memoryBackend {
	return &memoryBackend{ch: gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)}
}

func (b *memoryBackend) publisher() message.Publisher { return b.ch }

func (b *memoryBackend) subscriber(string, string) (message.Subscriber, deliveryTracker, error) {
	// One GoChannel serves every handler; closing it is the router's job.
	return nopCloseSubscriber{b.ch}, nil, nil
}

// group is "": every GoChannel subscriber gets every message.
func (b *memoryBackend) group(string) string { return "" }

func (b *memoryBackend) ensureTopic(string) error { return nil }

func (b *memoryBackend) lag(context.Context, []groupTopic) ([]telemetry.LagSample, error) {
	return nil, ErrLagUnknown
}

func (b *memoryBackend) estimateBacklog(context.Context, []telemetry.LagSample, int64) ([]vertexEstimate, error) {
	return nil, ErrLagUnknown
}

func (b *memoryBackend) deadLetter(func(*message.Message, bool)) message.HandlerMiddleware {
	return nil
}

func (b *memoryBackend) system() string { return "gochannel" }

// close has nothing left to do: the router closed the GoChannel when it
// closed the publisher.
func (b *memoryBackend) close() error { return nil }

type nopCloseSubscriber struct{ message.Subscriber }

func (nopCloseSubscriber) Close() error { return nil }

// noExtras answers the backend methods that only some brokers need with
// nothing: no bootstrap addresses, no redeliveries the router can tell, no
// counters of its own, no keep-alive and no key windows.
type noExtras struct{}

func (noExtras) redelivered(*message.Message, deliveryTracker) bool { return false }
func (noExtras) useCopies(message.Publisher)                        {}
func (noExtras) addStats(*Stats)                                    {}
func (noExtras) keepAlive() (redisbroker.SubscriberStats, bool) {
	return redisbroker.SubscriberStats{}, false
}
func (noExtras) keyWindows(func(group string, kt *kafkabroker.SessionTracker)) {}
func (noExtras) owned(s []telemetry.LagSample) []telemetry.LagSample           { return s }
func (noExtras) started()                                                      {}
