package embedded_test

import (
	"context"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/spillway-go/spillway/embedded"
	"github.com/spillway-go/spillway/telemetry/kafkatel"
)

// An embedded Kafka broker for a test or a demo, and the lag of a consumer
// group that has not committed anything yet: every retained message counts.
func ExampleStartKafka() {
	cluster, err := embedded.StartKafka(1, "parcels")
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_3_0_0
	cfg.Producer.Return.Successes = true
	client, err := sarama.NewClient(cluster.Brokers(), cfg)
	if err != nil {
		panic(err)
	}
	defer client.Close()

	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		panic(err)
	}
	for range 3 {
		if _, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: "parcels", Value: sarama.StringEncoder("{}")}); err != nil {
			panic(err)
		}
	}
	_ = producer.Close()

	source, err := kafkatel.NewLagSource(client, "indexer", "parcels")
	if err != nil {
		panic(err)
	}
	samples, err := source(context.Background())
	if err != nil {
		panic(err)
	}
	for _, s := range samples {
		fmt.Printf("%s/%d group %s: lag %d\n", s.Topic, s.Partition, s.Group, s.Lag)
	}
	// Output:
	// parcels/0 group indexer: lag 3
}
