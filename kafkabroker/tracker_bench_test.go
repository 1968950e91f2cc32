package kafkabroker

import (
	"context"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// BenchmarkTrackedDelivery is what the session tracker adds to each
// message of partition mode, against watermill-kafka's unmarshaler alone
// (tracker=none): tracker=unmarshal is the tracked unmarshaler, which
// records the claim's offset and the message it delivers; tracker=hooks
// adds the three calls the router makes for every message (Begin, Revoked,
// Completed). Twelve claims are live, as on the benchmark's 12 partitions.
func BenchmarkTrackedDelivery(b *testing.B) {
	sm, err := kafka.DefaultMarshaler{}.Marshal("t", message.NewMessage("m", []byte(`{"type":"Point","coordinates":[4.9,52.37]}`)))
	if err != nil {
		b.Fatal(err)
	}
	headers := toRecordHeaders(sm.Headers)
	value, err := sm.Value.Encode()
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"none", "unmarshal", "hooks"} {
		b.Run("tracker="+mode, func(b *testing.B) {
			tr := newPartitionTracker(nil, "g", nil)
			sess, cancel := context.WithCancel(context.Background())
			defer cancel()
			tr.mu.Lock()
			for p := range int32(12) {
				gp := groupPartition{"g", topicPartition{"t", p}}
				tr.setClaimLocked(topicPartition{"t", p}, newClaimState(sess, -1, tr.st.seen.slot(gp)), nil)
			}
			tr.mu.Unlock()
			var u kafka.Unmarshaler = kafka.DefaultMarshaler{}
			if mode != "none" {
				u = tr.wrapUnmarshaler(u)
			}
			b.ReportAllocs()
			var offset int64
			for b.Loop() {
				offset++
				msg, err := u.Unmarshal(&sarama.ConsumerMessage{Topic: "t", Partition: int32(offset % 12), Offset: offset,
					Value: value, Headers: headers})
				if err != nil {
					b.Fatal(err)
				}
				if mode == "hooks" {
					tr.st.Begin(msg)
					if tr.st.Revoked(msg) == nil {
						b.Fatal("no session channel")
					}
					tr.st.Completed(msg)
				}
			}
		})
	}
}
