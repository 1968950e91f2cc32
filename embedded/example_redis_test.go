package embedded_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	_ "github.com/spillway-go/spillway/embedded" // registers the embedded server for Addr "embedded"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/redisbroker"
)

// A budgeted router over Redis Streams: the dead-letter middleware outside
// the budget; the keep-alive runs inside the subscriber. With this package
// imported, Addr "embedded" runs an in-process server, so the example needs
// nothing installed; in production it is the server's host:port.
func Example_redis() {
	logger := watermill.NopLogger{}
	cfg := redisbroker.Config{Addr: spillway.Embedded, ConsumerGroup: "tiler", Consumers: 4}
	pub, err := redisbroker.NewPublisher(cfg, redisbroker.WithLogger(logger))
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	sub, err := redisbroker.NewSubscriber(cfg, redisbroker.WithLogger(logger))
	if err != nil {
		panic(err)
	}
	dead, err := redisbroker.NewDeadLetter(cfg, redisbroker.WithPublisher(pub))
	if err != nil {
		panic(err)
	}
	vb, err := middleware.NewVertexBudget(50_000)
	if err != nil {
		panic(err)
	}
	budget, err := middleware.New(vb)
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(dead.Middleware, budget.Middleware)

	const tiles = 3
	var done atomic.Int64
	finished := make(chan struct{})
	router.AddConsumerHandler("tiles", "tiles", sub, func(msg *message.Message) error {
		// The geometry work goes here.
		if done.Add(1) == tiles {
			close(finished)
		}
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	for i := range tiles {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"type":"Point","coordinates":[0,0]}`))
		msg.Metadata.Set(cost.MetadataKey, strconv.Itoa(i+1))
		if err := pub.Publish("tiles", msg); err != nil {
			panic(err)
		}
	}
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
	}
	_ = router.Close() // closes the subscriber too
	fmt.Println("processed", done.Load(), "tiles")
	// Output: processed 3 tiles
}
