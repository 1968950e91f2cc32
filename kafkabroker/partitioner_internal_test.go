package kafkabroker

import (
	"testing"
)

// murmur2 matches Kafka's own reference values (the signed 32-bit results
// of org.apache.kafka.common.utils.Utils.murmur2 in Kafka's unit test).
func TestMurmur2KafkaReference(t *testing.T) {
	for _, tt := range []struct {
		key  string
		want int32
	}{
		{"21", -973932308},
		{"foobar", -790332482},
		{"a-little-bit-long-string", -985981536},
		{"a-little-bit-longer-string", -1486304829},
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
		{"abc", 479470107},
	} {
		if got := int32(murmur2([]byte(tt.key))); got != tt.want {
			t.Errorf("murmur2(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

// Any key, of any length, hashes without panicking to a partition in range.
func FuzzMurmur2Partition(f *testing.F) {
	for _, s := range []string{"", "a", "ab", "abc", "abcd", "21", "foobar", "\xff\xfe\xfd\x80\x00"} {
		f.Add([]byte(s), int32(12))
	}
	f.Add([]byte("x"), int32(1))
	f.Add([]byte("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"), int32(2147483647))
	f.Fuzz(func(t *testing.T, key []byte, partitions int32) {
		if partitions <= 0 {
			return
		}
		p := murmur2Partition(key, partitions)
		if p < 0 || p >= partitions {
			t.Fatalf("murmur2Partition(%q, %d) = %d, out of range", key, partitions, p)
		}
	})
}
