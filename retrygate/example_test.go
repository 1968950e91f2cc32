package retrygate_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/retrygate"
)

// The gate sits outside budget admission; the router consumes the topic
// and its retry topic with the same stack. A transient failure is retried
// after a short backoff; an undecodable geometry goes straight to the
// dead-letter topic.
func Example() {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	defer pubSub.Close()

	budget, err := middleware.NewVertexBudget(10_000)
	if err != nil {
		panic(err)
	}
	admission, err := middleware.New(budget)
	if err != nil {
		panic(err)
	}
	cfg := retrygate.Config{InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond}
	gate, err := retrygate.New(pubSub, cfg, retrygate.WithPressure(budget))
	if err != nil {
		panic(err)
	}

	handled := make(chan string, 1)
	handler := func(msg *message.Message) error {
		g, err := cost.Decode(msg.Payload)
		if err != nil {
			return fmt.Errorf("decoding %s: %w", msg.UUID, err) // permanent
		}
		if retrygate.AttemptFromCtx(msg.Context()) == 1 {
			return errors.New("database timeout") // transient
		}
		handled <- fmt.Sprintf("%s: %d vertices", msg.UUID, cost.Vertices(g))
		return nil
	}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(gate.Middleware, admission.Middleware)
	router.AddConsumerHandler("parcels", "parcels", pubSub, handler)
	router.AddConsumerHandler("parcels_retry", cfg.RetryTopicFor("parcels"), pubSub, handler)

	deadLetters, err := pubSub.Subscribe(context.Background(), cfg.DeadLetterTopicFor("parcels"))
	if err != nil {
		panic(err)
	}
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	// Both are stamped with their cost, so neither fills the budget: an
	// unstamped message is charged the whole budget, which saturates it
	// while that message runs, and a failure then is deferred rather than
	// retried in process.
	good := message.NewMessage("parcel-1", []byte(`{"type":"LineString","coordinates":[[0,0],[1,1],[2,0]]}`))
	good.Metadata.Set(cost.MetadataKey, "3")
	broken := message.NewMessage("parcel-2", []byte(`<gml:Point/>`))
	broken.Metadata.Set(cost.MetadataKey, "1")
	if err := pubSub.Publish("parcels", good, broken); err != nil {
		panic(err)
	}

	fmt.Println(<-handled)
	dl := <-deadLetters
	dl.Ack()
	fmt.Println("dead letter:", dl.UUID, "from", dl.Metadata.Get(wmw.PoisonedTopicKey),
		"after", dl.Metadata.Get("spillway_attempt"), "attempt,",
		dl.Metadata.Get(retrygate.DeadLetterCauseKey))

	_ = router.Close()
	st := gate.Stats()
	fmt.Printf("handled %d, retries %d, dead-lettered %d\n", st.Handled, st.Retries, st.DeadLettered)
	// Output:
	// parcel-1: 3 vertices
	// dead letter: parcel-2 from parcels after 1 attempt, malformed
	// handled 1, retries 1, dead-lettered 1
}
