package middleware_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
)

// A budget of 50,000 vertices admits two 20,000-vertex charges at once; a
// third waits until one is released. A charge larger than the whole budget
// is clamped and runs alone.
func ExampleVertexBudget() {
	ctx := context.Background()
	budget, err := middleware.NewVertexBudget(50_000)
	if err != nil {
		panic(err)
	}

	a, _ := budget.Acquire(ctx, 20_000)
	b, _ := budget.Acquire(ctx, 20_000)
	s := budget.Stats()
	fmt.Println("in use:", s.InUse, "saturated:", s.SaturatedFor > 0)

	// Only 10,000 vertices are free: a third charge waits until its
	// context gives up.
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	_, err = budget.Acquire(short, 20_000)
	cancel()
	fmt.Println("third:", err)

	a.Release()
	b.Release()

	big, _ := budget.Acquire(ctx, 80_000)
	s = budget.Stats()
	fmt.Println("clamped:", s.Clamped, "in use:", s.InUse)
	big.Release()
	fmt.Println("in use:", budget.Stats().InUse)
	// Output:
	// in use: 40000 saturated: false
	// third: context deadline exceeded
	// clamped: 1 in use: 50000
	// in use: 0
}

// The admission middleware charges each message its vertex_count before
// the handler runs and refunds it afterwards, on every path.
func ExampleNew() {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	router, _ := message.NewRouter(message.RouterConfig{}, logger)

	budget, err := middleware.NewVertexBudget(100_000)
	if err != nil {
		panic(err)
	}
	admission, err := middleware.New(budget,
		middleware.WithEstimator(cost.NewEstimator(cost.FullBudget)),
		middleware.WithOnAdmission(func(msg *message.Message, a middleware.Admission) {
			fmt.Printf("%s: %s, %d vertices\n", msg.UUID, a.Result, a.Granted)
		}))
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(admission.Middleware)

	done := make(chan struct{})
	router.AddConsumerHandler("parcels", "parcels", pubSub, func(msg *message.Message) error {
		fmt.Printf("handling %s with %d of %d vertices in use\n",
			msg.UUID, budget.Stats().InUse, budget.Capacity())
		close(done)
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	msg := message.NewMessage("parcel-1", []byte(`{"type":"Point","coordinates":[1,2]}`))
	msg.Metadata.Set(cost.MetadataKey, "1250")
	_ = pubSub.Publish("parcels", msg)

	<-done
	_ = router.Close()
	fmt.Println("after close:", budget.Stats().InUse)
	// Output:
	// parcel-1: admitted, 1250 vertices
	// handling parcel-1 with 1250 of 100000 vertices in use
	// after close: 0
}

// Two lanes on one budget: positions (charges below 1,000 vertices) with a
// tenth of the budget reserved, and boundaries for the rest. While heavy
// boundaries hold all they may and another waits, a position is admitted
// at once from its lane's reservation.
func ExampleWithLanes() {
	ctx := context.Background()
	budget, err := middleware.NewVertexBudget(100_000, middleware.WithLanes(
		middleware.Lane{Name: "positions", MaxCharge: 1_000, Reserve: 0.1},
		middleware.Lane{Name: "boundaries", Weight: 1},
	))
	if err != nil {
		panic(err)
	}

	heavy, _ := budget.Acquire(ctx, 250_000) // clamped to 90,000: the rest is reserved
	waiting := make(chan struct{})
	go func() {
		p, _ := budget.Acquire(ctx, 60_000) // waits for the first boundary
		p.Release()
		close(waiting)
	}()
	for budget.Stats().Waiting == 0 {
		time.Sleep(time.Millisecond)
	}

	ping, _ := budget.Acquire(ctx, 12)
	for _, l := range budget.Lanes() {
		fmt.Printf("%s: %d of %d in use, %d waiting\n", l.Name, l.InUse, l.Capacity, l.Waiting)
	}
	ping.Release()
	heavy.Release()
	<-waiting
	fmt.Println("in use:", budget.Stats().InUse)
	// Output:
	// positions: 12 of 100000 in use, 0 waiting
	// boundaries: 90000 of 90000 in use, 1 waiting
	// in use: 0
}
