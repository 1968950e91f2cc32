package router

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/kafkatest"
)

// Issue 35, item 3: records from a producer that is not Watermill (a plain
// Sarama producer here: a key, a payload, no _watermill_message_uuid, no
// entity_id) keep their Kafka key when the router copies them: oversize and
// malformed dead-letter copies with the retry gate off, and with it on also
// the gate's dead-letter copies of a message that kept failing (its retry
// copies are made the same way), in partition and key mode. The copies land
// on the partitions their originals are on (both sides use librdkafka's
// CRC32 placement, the same partition count), so they spread as the
// originals do instead of piling onto one partition with an empty key.
func TestKafkaCopiesKeepRecordKey(t *testing.T) {
	const partitions = 8
	broker := kafkatest.Start(t, partitions)
	for _, tt := range []struct {
		name     string
		topic    string
		retry    bool
		consumer string
	}{
		{"retry gate off", "feed-off", false, ""},
		{"retry gate on", "feed-on", true, ""},
		{"key mode", "feed-key", true, "key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			topic := tt.topic
			cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
			cfg.Kafka.Brokers = broker.Brokers()
			cfg.Kafka.Version = "2.3.0" // kfake's limit
			cfg.Kafka.Partitions = partitions
			cfg.Kafka.CreateTopics = true
			cfg.Kafka.Partitioner = "crc32"
			cfg.Kafka.Consumer = tt.consumer
			cfg.Kafka.HeartbeatInterval = 200 * time.Millisecond
			cfg.Budget.MaxPayloadBytes = 4 << 10
			cfg.Telemetry.Disabled = true
			if tt.retry {
				cfg.Retry = fastRetry()
			} else {
				cfg.Retry.Disabled = true
			}
			r, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.AddConsumerHandler("h", topic, func(m *message.Message) error {
				switch {
				case bytes.Equal(m.Payload, []byte("malformed")):
					return fmt.Errorf("decoding: %w", cost.ErrMalformed)
				case bytes.Equal(m.Payload, []byte("fail")):
					return errors.New("cannot process now")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			errc := runRouter(t, r)
			defer closeRouter(t, r, errc)

			// Originals: key i is oversize, malformed, or (gate on) failing.
			sc := sarama.NewConfig()
			sc.Version = sarama.V2_3_0_0
			sc.Producer.Return.Successes = true
			sc.Producer.Partitioner = sarama.NewConsistentCRCHashPartitioner
			prod, err := sarama.NewSyncProducer(broker.Brokers(), sc)
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			origin := map[string]int32{}
			wantDead := map[string]bool{}
			kinds := 2
			if tt.retry {
				kinds = 3
			}
			for i := range 40 {
				key := fmt.Sprintf("vessel-%02d", i)
				var payload []byte
				switch i % kinds {
				case 0:
					payload = bytes.Repeat([]byte(" "), 8<<10)
				case 1:
					payload = []byte("malformed")
				default:
					payload = []byte("fail") // dead-lettered by the gate
				}
				wantDead[key] = true
				p, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(payload)})
				if err != nil {
					t.Fatal(err)
				}
				origin[key] = p
			}
			spread := map[int32]bool{}
			for _, p := range origin {
				spread[p] = true
			}
			if len(spread) < partitions/2 {
				t.Fatalf("originals on %d partitions only; the keys do not spread", len(spread))
			}

			check := func(dest string, want map[string]bool) {
				t.Helper()
				got := readRecordKeys(t, broker.Brokers(), dest, partitions, len(want))
				keys := map[string]bool{}
				for _, rec := range got {
					keys[rec.key] = true
					if !want[rec.key] {
						t.Errorf("%s: copy keyed %q, want one of the originals' keys", dest, rec.key)
						continue
					}
					if rec.partition != origin[rec.key] {
						t.Errorf("%s: copy of %q on partition %d, its original on %d", dest, rec.key, rec.partition, origin[rec.key])
					}
				}
				if len(keys) != len(want) {
					t.Errorf("%s: copies of %d keys, want %d: %v", dest, len(keys), len(want), sortedKeys(keys))
				}
			}
			check(topic+".dead_letter", wantDead)
		})
	}
}

type keyedRecord struct {
	key       string
	partition int32
}

// readRecordKeys reads topic's partitions from the start until it has at
// least n records, and returns their keys and partitions.
func readRecordKeys(t *testing.T, brokers []string, topic string, partitions int32, n int) []keyedRecord {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_3_0_0
	consumer, err := sarama.NewConsumer(brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	var (
		mu  sync.Mutex
		got []keyedRecord
	)
	deadline := time.Now().Add(60 * time.Second)
	var pcs []sarama.PartitionConsumer
	for time.Now().Before(deadline) {
		if pcs == nil {
			for p := range partitions {
				pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
				if err != nil { // the topic is created with the first copy
					for _, c := range pcs {
						_ = c.Close()
					}
					pcs = nil
					break
				}
				pcs = append(pcs, pc)
				go func() {
					for rec := range pc.Messages() {
						mu.Lock()
						got = append(got, keyedRecord{string(rec.Key), rec.Partition})
						mu.Unlock()
					}
				}()
			}
		}
		mu.Lock()
		done := len(got) >= n
		mu.Unlock()
		if done {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, pc := range pcs {
		_ = pc.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) < n {
		t.Fatalf("%s: %d records after 60s, want %d", topic, len(got), n)
	}
	return append([]keyedRecord(nil), got...)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
