package router

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// produceTxn writes one transaction of a transactional Sarama producer (a
// producer of another service, not the router's) to partition p: n
// records with headers seq and txn, committed or aborted.
func produceTxn(t *testing.T, addrs []string, topic string, p int32, txn string, n int, commit bool) {
	t.Helper()
	c := sarama.NewConfig()
	c.Version = sarama.V2_3_0_0
	c.Producer.Return.Successes = true
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Retry.Max = 1
	c.Net.MaxOpenRequests = 1
	c.Producer.Transaction.ID = "other-service"
	producer, err := sarama.NewSyncProducer(addrs, c)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	if err := producer.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, _, err := producer.SendMessage(&sarama.ProducerMessage{
			Topic: topic, Partition: p, Value: sarama.ByteEncoder(pingPayload(i)),
			Headers: []sarama.RecordHeader{
				{Key: []byte("seq"), Value: []byte(strconv.Itoa(i))},
				{Key: []byte("txn"), Value: []byte(txn)},
			},
		}); err != nil {
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

// TestKafkaReadCommitted: with the default kafka.isolation_level, records
// of aborted transactions never reach a handler, those of committed ones
// all do, and once they are processed Router.Lag reads 0 although
// transaction markers and aborted records lie past the committed offsets.
// In both consumer modes.
func TestKafkaReadCommitted(t *testing.T) {
	for _, mode := range []string{kafkabroker.ConsumerPartition, kafkabroker.ConsumerKey} {
		t.Run(mode, func(t *testing.T) {
			topic := "txn-" + mode
			broker := kafkatest.Start(t, 2, topic)
			addrs := broker.Brokers()
			want := map[string]int{}
			for p := range int32(2) {
				pp := strconv.Itoa(int(p))
				produceTxn(t, addrs, topic, p, "commit-a"+pp, 5, true)
				produceTxn(t, addrs, topic, p, "abort-b"+pp, 3, false)
				produceTxn(t, addrs, topic, p, "commit-c"+pp, 2, true)
				produceTxn(t, addrs, topic, p, "abort-d"+pp, 4, false) // the log ends aborted
				want["commit-a"+pp], want["commit-c"+pp] = 5, 2
			}

			cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
			cfg.Budget.Vertices = 1000
			cfg.Kafka.Brokers = addrs
			cfg.Kafka.Version = "2.3.0"
			cfg.Kafka.Partitions = 2
			cfg.Kafka.HeartbeatInterval = 250 * time.Millisecond
			cfg.Kafka.Consumer = mode
			var (
				mu  sync.Mutex
				got = map[string]int{}
				n   int
			)
			r, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.AddConsumerHandler("h", topic, func(msg *message.Message) error {
				mu.Lock()
				got[msg.Metadata.Get("txn")]++
				n++
				mu.Unlock()
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			runErr := make(chan error, 1)
			go func() { runErr <- r.Run(context.Background()) }()
			defer func() {
				if err := r.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
				<-runErr
			}()

			// Lag reads 0 only once the 14 committed records are processed
			// and committed.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			lag := int64(-1)
			for ctx.Err() == nil {
				mu.Lock()
				done := n >= 14
				mu.Unlock()
				if done {
					if lag, err = r.Lag(ctx); err == nil && lag == 0 {
						break
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond) // an aborted record, if any, shows up now
			mu.Lock()
			defer mu.Unlock()
			if lag != 0 {
				t.Errorf("lag %d (err %v) after the committed records were processed, want 0", lag, err)
			}
			for txn, c := range got {
				if c != want[txn] {
					t.Errorf("transaction %s: %d records handled, want %d", txn, c, want[txn])
				}
			}
			for txn, c := range want {
				if got[txn] != c {
					t.Errorf("transaction %s: %d records handled, want %d", txn, got[txn], c)
				}
			}
		})
	}
}
