package redisbroker_test

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/redisbroker"
)

// A budgeted router over Redis Streams: the dead-letter middleware outside
// the budget; the keep-alive runs inside the subscriber.
func ExampleNewSubscriber() {
	logger := watermill.NewStdLogger(false, false)
	cfg := redisbroker.Config{Addr: "127.0.0.1:6379", ConsumerGroup: "tiler", Consumers: 8}
	pub, err := redisbroker.NewPublisher(cfg, logger)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	sub, err := redisbroker.NewSubscriber(cfg, logger)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	dead, err := redisbroker.NewDeadLetter(redisbroker.DeadLetterConfig{Publisher: pub, Topic: cfg.DeadLetterTopic})
	if err != nil {
		panic(err)
	}
	budget, err := middleware.NewBudget(middleware.BudgetConfig{Budget: middleware.NewVertexBudget(50_000)})
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(dead.Middleware, budget.Middleware)
	router.AddConsumerHandler("tiles", "tiles", sub, func(msg *message.Message) error {
		return nil // the geometry work
	})
	_ = router.Run(context.Background())
}
