package kafkatel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/telemetry/kafkatel"
)

// produceTxn writes values to partition p of topic in one transaction of a
// transactional Sarama producer, committed or aborted.
func produceTxn(t *testing.T, addrs []string, topic string, p int32, commit bool, values ...string) {
	t.Helper()
	c := saramaConfig()
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Retry.Max = 1
	c.Net.MaxOpenRequests = 1
	c.Producer.Transaction.ID = "txn-" + t.Name()
	producer, err := sarama.NewSyncProducer(addrs, c)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	if err := producer.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		if _, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: p, Value: sarama.StringEncoder(v)}); err != nil {
			t.Fatal(err)
		}
	}
	if commit {
		err = producer.CommitTxn()
	} else {
		err = producer.AbortTxn()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Under read-committed, lag counts what a read-committed consumer will
// still receive: a partition it has drained reads 0 although transaction
// markers and aborted records lie past its committed offset, and one with
// a committed record still ahead reads more than 0.
func TestLagReadCommitted(t *testing.T) {
	cluster := kafkatest.Start(t, 3, "txns")
	addrs := cluster.Brokers()
	produceTxn(t, addrs, "txns", 0, true, "a", "b", "c")
	produceTxn(t, addrs, "txns", 0, false, "d", "e") // drained, ends with an aborted transaction
	produceTxn(t, addrs, "txns", 1, false, "x", "y")
	produceTxn(t, addrs, "txns", 1, true, "z") // z still to read
	produceTxn(t, addrs, "txns", 2, true, "m") // drained, ends with a commit marker

	cfg := saramaConfig()
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	group, err := sarama.NewConsumerGroup(addrs, "workers", cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &consumeUpTo{want: map[int32]int64{0: 3, 2: 1}, got: map[int32]int64{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	consumeDone := make(chan struct{})
	go func() {
		defer close(consumeDone)
		for ctx.Err() == nil {
			if err := group.Consume(ctx, []string{"txns"}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	select {
	case <-h.done:
	case <-time.After(30 * time.Second):
		t.Fatal("consumer group did not consume in time")
	}
	cancel()
	<-consumeDone
	if err := group.Close(); err != nil {
		t.Fatal(err)
	}

	client, err := sarama.NewClient(addrs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	src, err := kafkatel.NewLagSource(client, "workers", "txns")
	if err != nil {
		t.Fatal(err)
	}
	samples, err := src(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 3 {
		t.Fatalf("%d samples, want 3: %+v", len(samples), samples)
	}
	for _, s := range samples {
		switch s.Partition {
		case 0, 2:
			if s.Lag != 0 {
				t.Errorf("drained partition %d reads lag %d, want 0", s.Partition, s.Lag)
			}
		case 1:
			if s.Lag == 0 {
				t.Errorf("partition 1 has a committed record to read but reads lag 0")
			}
		}
	}
}
