package embedded

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/spillway-go/spillway/internal/embedreg"
)

func init() {
	embedreg.RegisterKafka(startKafka)
	embedreg.RegisterRedis(startRedis)
}

// Kafka is a running in-process Kafka broker.
type Kafka struct {
	cluster *kfake.Cluster
}

// StartKafka starts an in-process Kafka broker on a free loopback port.
// Topics are created with partitions partitions (at least 1); topics not
// listed are created on first use with the same count. Close stops it.
func StartKafka(partitions int32, topics ...string) (*Kafka, error) {
	if partitions < 1 {
		return nil, fmt.Errorf("embedded: partitions must be at least 1, got %d", partitions)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.DefaultNumPartitions(int(partitions)),
		kfake.AllowAutoTopicCreation(),
	}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(partitions, topics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded: starting kafka: %w", err)
	}
	return &Kafka{cluster: c}, nil
}

// Brokers returns the bootstrap addresses (host:port) to give a client.
func (k *Kafka) Brokers() []string { return k.cluster.ListenAddrs() }

// Close stops the broker; the data it held is gone.
func (k *Kafka) Close() { k.cluster.Close() }

func startKafka(partitions int32, topics []string) ([]string, func(), error) {
	k, err := StartKafka(partitions, topics...)
	if err != nil {
		return nil, nil, err
	}
	return k.Brokers(), k.Close, nil
}

func startRedis() (string, func(), error) {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		return "", nil, fmt.Errorf("embedded: starting miniredis: %w", err)
	}
	return srv.Addr(), srv.Close, nil
}
