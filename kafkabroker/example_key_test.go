package kafkabroker_test

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/embedreg"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// A program links the embedded broker by importing
// github.com/spillway-go/spillway/embedded; the library's own tests run it as
// a separate process instead.
func init() { embedreg.RegisterKafka(kafkatest.Embedded) }

// Consumer key on one partition: messages of different keys are in flight
// together (here all six before any is acked), while each key's messages
// come one at a time, in order.
func ExampleCluster_NewSubscriber_key() {
	cl, err := kafkabroker.New(kafkabroker.Config{
		Brokers:    []string{spillway.Embedded},
		Partitions: 1,
		Consumer:   kafkabroker.ConsumerKey,
	})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	if err := cl.EnsureTopic("parcels"); err != nil {
		panic(err)
	}
	pub, err := cl.NewPublisher()
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	for i := range 12 {
		m := message.NewMessage(strconv.Itoa(i), []byte("{}"))
		m.Metadata.Set("entity_id", "parcel-"+strconv.Itoa(i%6)) // the Kafka key
		if err := pub.Publish("parcels", m); err != nil {
			panic(err)
		}
	}

	sub, _, err := cl.NewSubscriber("indexer")
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "parcels")
	if err != nil {
		panic(err)
	}
	var held []*message.Message
	for range 6 {
		held = append(held, <-msgs) // six keys in flight, none acked
	}
	fmt.Println("in flight:", len(held))
	for _, m := range held {
		m.Ack() // each ack releases the next message of its key
	}
	for range 6 {
		m := <-msgs
		fmt.Println(m.Metadata.Get("entity_id"), "second message:", m.UUID)
		m.Ack()
	}
	// Unordered output:
	// in flight: 6
	// parcel-0 second message: 6
	// parcel-1 second message: 7
	// parcel-2 second message: 8
	// parcel-3 second message: 9
	// parcel-4 second message: 10
	// parcel-5 second message: 11
}

// A handler reads the record a message came from, its partition, offset
// and key, the same way in either consumer mode.
func ExamplePartitionFromCtx() {
	cl, err := kafkabroker.New(kafkabroker.Config{
		Brokers:    []string{spillway.Embedded},
		Partitions: 1,
		Consumer:   kafkabroker.ConsumerKey,
	})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	if err := cl.EnsureTopic("positions"); err != nil {
		panic(err)
	}
	pub, err := cl.NewPublisher()
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	m := message.NewMessage("p-1", []byte("{}"))
	m.Metadata.Set("entity_id", "vehicle-7")
	if err := pub.Publish("positions", m); err != nil {
		panic(err)
	}

	sub, _, err := cl.NewSubscriber("tracker")
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "positions")
	if err != nil {
		panic(err)
	}
	got := <-msgs
	ctx := got.Context()
	partition, _ := kafkabroker.PartitionFromCtx(ctx)
	offset, _ := kafkabroker.OffsetFromCtx(ctx)
	key, _ := kafkabroker.KeyFromCtx(ctx)
	fmt.Printf("partition %d, offset %d, key %s\n", partition, offset, key)
	got.Ack()
	// Output: partition 0, offset 0, key vehicle-7
}
