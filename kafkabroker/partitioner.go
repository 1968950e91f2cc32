package kafkabroker

import (
	"github.com/IBM/sarama"
)

// Partitioner names, the values of Config.Partitioner. docs/kafka.md,
// "Mixing clients", says which client hashes how.
const (
	// partitionerMurmur2 is Kafka's own: the Java client, Kafka Streams,
	// Kafka Connect, and librdkafka's murmur2_random. The default.
	partitionerMurmur2 = "murmur2"
	// partitionerCRC32 is librdkafka's consistent and consistent_random
	// (its default, also kcat's).
	partitionerCRC32 = "crc32"
	// partitionerHash is Sarama's default: FNV-1a.
	partitionerHash = "hash"

	defaultPartitioner = partitionerMurmur2
)

// partitionerFor returns the Sarama partitioner constructor named name
// (a validated Config.Partitioner).
func partitionerFor(name string) sarama.PartitionerConstructor {
	switch name {
	case partitionerCRC32:
		return sarama.NewConsistentCRCHashPartitioner
	case partitionerHash:
		return sarama.NewHashPartitioner
	default:
		return newMurmur2Partitioner
	}
}

// murmur2Partitioner places a keyed message as Kafka's Java client does:
// toPositive(murmur2(key)) % partitions, where toPositive clears the sign
// bit. A message without a key goes to a random partition.
type murmur2Partitioner struct {
	random sarama.Partitioner
}

func newMurmur2Partitioner(topic string) sarama.Partitioner {
	return murmur2Partitioner{random: sarama.NewRandomPartitioner(topic)}
}

func (p murmur2Partitioner) Partition(msg *sarama.ProducerMessage, partitions int32) (int32, error) {
	if msg.Key == nil {
		return p.random.Partition(msg, partitions)
	}
	key, err := msg.Key.Encode()
	if err != nil {
		return -1, err
	}
	return murmur2Partition(key, partitions), nil
}

// RequiresConsistency is true: a key must always map to the same
// partition, even while that partition has no leader.
func (murmur2Partitioner) RequiresConsistency() bool { return true }

// murmur2Partition is the partition, of partitions, that Kafka's Java
// client chooses for key.
func murmur2Partition(key []byte, partitions int32) int32 {
	return int32(murmur2(key)&0x7fffffff) % partitions
}

// murmur2 is the 32-bit MurmurHash2 variant Kafka's clients use (seed
// 0x9747b28c, the key read as little-endian 32-bit blocks). Kafka reads its
// result as a signed int32; callers convert.
func murmur2(data []byte) uint32 {
	const (
		seed = 0x9747b28c
		m    = 0x5bd1e995
		r    = 24
	)
	n := len(data)
	h := uint32(seed) ^ uint32(n)
	blocks := n / 4
	for i := 0; i < blocks; i++ {
		b := data[i*4 : i*4+4]
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[blocks*4:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
