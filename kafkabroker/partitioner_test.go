package kafkabroker_test

import (
	"errors"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// Kafka's reference murmur2 values (signed), from Kafka's own unit test:
// the partition Java's client picks follows from them alone.
var javaMurmur2 = map[string]int32{
	"21":                         -973932308,
	"foobar":                     -790332482,
	"a-little-bit-long-string":   -985981536,
	"a-little-bit-longer-string": -1486304829,
	"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
	"abc": 479470107,
}

// TestPartitionerPlacement publishes keyed messages through a Cluster's
// publisher (the real Sarama producer) to a broker and reads back where
// each landed: with the default, and with murmur2, a key goes where
// Kafka's Java client would put it (toPositive(murmur2(key)) % n); with
// crc32 where librdkafka's consistent partitioner would (crc32(key) % n);
// with hash where Sarama's default would.
func TestPartitionerPlacement(t *testing.T) {
	const partitions = 12
	broker := kafkatest.Start(t, partitions)
	keys := make([]string, 0, len(javaMurmur2))
	for k := range javaMurmur2 {
		keys = append(keys, k)
	}
	sarHash := sarama.NewHashPartitioner("")
	for _, tt := range []struct {
		partitioner string
		want        func(key string) int32
	}{
		{"", func(key string) int32 { return (javaMurmur2[key] & 0x7fffffff) % partitions }},
		{"murmur2", func(key string) int32 { return (javaMurmur2[key] & 0x7fffffff) % partitions }},
		{"crc32", func(key string) int32 { return int32(crc32.ChecksumIEEE([]byte(key)) % partitions) }},
		{"hash", func(key string) int32 {
			p, err := sarHash.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, partitions)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}},
	} {
		name := tt.partitioner
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			topic := "placed-" + name
			cl, err := kafkabroker.New(kafkabroker.Config{
				Brokers:      broker.Brokers(),
				Version:      "2.3.0", // kfake's limit
				Partitions:   partitions,
				CreateTopics: true,
				Topics:       []string{topic},
				Partitioner:  tt.partitioner,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			pub, err := cl.NewPublisher()
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			for _, k := range keys {
				m := message.NewMessage(k, []byte(`{}`))
				m.Metadata.Set("entity_id", k)
				if err := pub.Publish(topic, m); err != nil {
					t.Fatal(err)
				}
			}
			got := partitionsOfKeys(t, broker.Brokers(), topic, partitions)
			differs := 0
			for _, k := range keys {
				if want := tt.want(k); got[k] != want {
					t.Errorf("key %q landed on partition %d, want %d", k, got[k], want)
				}
				if got[k] != (javaMurmur2[k]&0x7fffffff)%partitions {
					differs++
				}
			}
			if tt.partitioner == "hash" && differs == 0 {
				t.Error("every key landed where murmur2 puts it; the test keys do not tell the partitioners apart")
			}
		})
	}
}

// partitionsOfKeys reads every record of topic and returns the partition
// each key is on.
func partitionsOfKeys(t *testing.T, brokers []string, topic string, partitions int32) map[string]int32 {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_3_0_0
	client, err := sarama.NewClient(brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	got := map[string]int32{}
	for p := range partitions {
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		if hwm == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case rec := <-pc.Messages():
				if prev, ok := got[string(rec.Key)]; ok && prev != p {
					t.Errorf("key %q on partitions %d and %d", rec.Key, prev, p)
				}
				got[string(rec.Key)] = p
				if rec.Offset+1 < hwm {
					continue
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("partition %d: no record before offset %d", p, hwm)
			}
			break
		}
		_ = pc.Close()
	}
	return got
}

// An unknown partitioner is a field error naming the allowed values.
func TestPartitionerValidated(t *testing.T) {
	err := kafkabroker.Config{Brokers: []string{"k:9092"}, Partitioner: "murmur2_random"}.Validate()
	var fe *spillway.FieldError
	if !errors.As(err, &fe) || fe.Field != "partitioner" || fe.Value != "murmur2_random" {
		t.Fatalf("Validate = %v, want a FieldError for partitioner", err)
	}
	for _, allowed := range []string{"murmur2", "crc32", "hash"} {
		if !strings.Contains(fe.Reason, allowed) {
			t.Errorf("reason %q does not name %s", fe.Reason, allowed)
		}
	}
}

// A message with neither the key field nor a UUID (a record from another
// client, without a key, being copied) is spread over the partitions as a
// message without a key would be, not hashed onto one by the empty key.
func TestUnkeyedMessagesSpread(t *testing.T) {
	const partitions = 12
	broker := kafkatest.Start(t, partitions)
	cl, err := kafkabroker.New(kafkabroker.Config{
		Brokers:      broker.Brokers(),
		Version:      "2.3.0", // kfake's limit
		Partitions:   partitions,
		CreateTopics: true,
		Topics:       []string{"unkeyed"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pub, err := cl.NewPublisher()
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	const n = 24
	for range n {
		if err := pub.Publish("unkeyed", message.NewMessage("", []byte(`{}`))); err != nil {
			t.Fatal(err)
		}
	}
	got := partitionsOfKeys(t, broker.Brokers(), "unkeyed", partitions)
	used := map[int32]bool{}
	for _, p := range got {
		used[p] = true
	}
	if len(got) != n || len(used) < 2 {
		t.Errorf("%d messages with %d distinct keys on %d partitions, want %d distinct keys spread over several", n, len(got), len(used), n)
	}
}
