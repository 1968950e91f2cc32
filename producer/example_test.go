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
		VerticesPerSecond: 50_000,
		Burst:             200_000,
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

	// A LineString of 3 vertices.
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"type":"LineString","coordinates":[[0,0],[1,1],[2,2]]}`))
	if err := pub.Publish("shapes", msg); err != nil {
		panic(err)
	}
	fmt.Println("charged:", limited.Stats().Vertices, "vertices; throttle delay:", throttled.Delay())
	// Output:
	// charged: 3 vertices; throttle delay: 0s
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
