package shedding_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/shedding"
)

// lagPressure stands in for a pressure signal that has reported pressure
// for 45 seconds, such as consumer lag above a threshold. Usually the
// pressure signal is the *middleware.VertexBudget itself.
type lagPressure struct{}

func (lagPressure) SaturatedFor() time.Duration { return 45 * time.Second }

// Under sustained pressure a low-priority vehicle position is shed and
// published to the audit topic; a high-priority one is handled, and so is
// a low-priority message of a topic that is not on the allow-list.
func ExamplePolicy() {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	defer pubSub.Close()

	pol, err := shedding.New(shedding.Config{
		Topics:     []string{"vehicle.positions"},
		AuditTopic: "spillway.shed",
	}, shedding.WithPressure(lagPressure{}), shedding.WithAuditPublisher(pubSub))
	if err != nil {
		panic(err)
	}
	budget, err := middleware.NewVertexBudget(100_000)
	if err != nil {
		panic(err)
	}
	admission, _ := middleware.New(budget, middleware.WithRevoked(pol.Revoked(nil)))
	router, _ := message.NewRouter(message.RouterConfig{}, logger)
	router.AddMiddleware(pol.Middleware, admission.Middleware, pol.Admitted)

	out := make(chan string)
	for _, topic := range []string{"vehicle.positions", "parcels"} {
		router.AddConsumerHandler(topic, topic, pubSub, func(msg *message.Message) error {
			out <- "handled " + msg.UUID
			return nil
		})
	}
	audit, _ := pubSub.Subscribe(context.Background(), "spillway.shed")
	go func() {
		for msg := range audit {
			out <- fmt.Sprintf("audit %s: %s from %s", msg.UUID,
				msg.Metadata.Get(shedding.MetadataReason), msg.Metadata.Get(shedding.MetadataTopic))
			msg.Ack()
		}
	}()
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	send := func(topic, uuid, priority string) {
		msg := message.NewMessage(uuid, []byte(`{"type":"Point","coordinates":[4.9,52.4]}`))
		msg.Metadata.Set("vertex_count", "1")
		msg.Metadata.Set("region_priority", priority)
		_ = pubSub.Publish(topic, msg)
		fmt.Println(<-out)
	}
	send("vehicle.positions", "pos-1", "0")
	send("vehicle.positions", "pos-2", "3")
	send("parcels", "parcel-1", "0")

	_ = router.Close()
	fmt.Println("shedding:", pol.Stats().Shedding)
	// Output:
	// audit pos-1: shed_priority from vehicle.positions
	// handled pos-2
	// handled parcel-1
	// shedding: true
}

// The policy is loaded as a section of a YAML configuration; Validate
// names every bad field and its value.
func ExampleConfig_Validate() {
	var cfg struct {
		Shedding shedding.Config `yaml:"shedding"`
	}
	_ = yaml.Unmarshal([]byte(`
shedding:
  topics: [vehicle.positions, sensor.telemetry]
  audit_topic: sensor.telemetry
  priority:
    window: -5s
  version_guard:
    enabled: true
`), &cfg)
	fmt.Println(cfg.Shedding.Validate())
	c := cfg.Shedding.WithDefaults()
	fmt.Println(c.Priority.Key, c.Priority.ShedBelow, c.VersionGuard.MaxEntities)
	// Output:
	// config: audit_topic: must not be a sheddable topic (it is topics[1]), got "sensor.telemetry"
	// config: priority.window: must be positive, got "-5s"
	// region_priority 2 100000
}
