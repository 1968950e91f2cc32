package producer_test

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/producer"
)

// discard is a publisher that drops everything.
type discard struct{}

func (discard) Publish(string, ...*message.Message) error { return nil }
func (discard) Close() error                              { return nil }

// constantLag is a lag reader that always reports the same lag; in
// production use telemetry.LagSampler or redisbroker.LagSampler.
type constantLag int64

func (l constantLag) TotalLag() int64 { return int64(l) }

// The producer chain, outermost first: stamp each message's vertex count,
// wait while the consumers lag, then charge the count against the rate.
func Example() {
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer broker.Close()

	limited, err := producer.NewRateLimited(broker, producer.RateLimitConfig{
		VerticesPerSecond: 1,
		Burst:             5,
		Mode:              producer.Reject,
	})
	if err != nil {
		panic(err)
	}
	throttled, err := producer.NewLagThrottled(limited, constantLag(0), producer.LagThrottleConfig{Threshold: 10_000})
	if err != nil {
		panic(err)
	}
	pub := cost.NewStampingPublisher(throttled)

	// A LineString of 3 vertices: the first fits the bucket of 5, the
	// second does not.
	line := func() *message.Message {
		return message.NewMessage(watermill.NewUUID(), []byte(`{"type":"LineString","coordinates":[[0,0],[1,1],[2,2]]}`))
	}
	fmt.Println(pub.Publish("shapes", line()))
	err = pub.Publish("shapes", line())
	fmt.Println(errors.Is(err, producer.ErrRateLimited), "rejected:", limited.Stats().Rejected, "throttled:", throttled.Stats().Throttled)
	// Output:
	// <nil>
	// true rejected: 1 throttled: 0
}

// Constructors return errors for bad input; each bad field is a
// *spillway.FieldError that matches spillway.ErrInvalidConfig.
func ExampleNewRateLimited_invalid() {
	_, err := producer.NewRateLimited(discard{}, producer.RateLimitConfig{VerticesPerSecond: -5})
	var ce *spillway.FieldError
	fmt.Println(errors.Is(err, spillway.ErrInvalidConfig), errors.As(err, &ce) && ce.Field == "vertices_per_second")
	_, err = producer.NewRateLimited(nil, producer.RateLimitConfig{VerticesPerSecond: 5})
	fmt.Println(errors.Is(err, spillway.ErrInvalidConfig), errors.As(err, &ce) && ce.Field == "pub")
	// Output:
	// true true
	// true true
}
