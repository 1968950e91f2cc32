package cost_test

import (
	"encoding/binary"
	"encoding/hex"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
)

// largestCountry is the biggest feature of the countries file (Russia, a
// multipolygon of thousands of vertices).
func largestCountry(b *testing.B) []byte {
	b.Helper()
	var largest []byte
	for _, line := range readLines(b, countriesFile) {
		if len(line) > len(largest) {
			largest = line
		}
	}
	return largest
}

// benchPayloads returns the largest country in every supported encoding.
func benchPayloads(b *testing.B) []struct {
	name    string
	payload []byte
} {
	line := largestCountry(b)
	g := decodeFeature(b, line)
	ewkbBytes := mustEWKB(b, withSRID(b, g, 4326), binary.LittleEndian)
	return []struct {
		name    string
		payload []byte
	}{
		{"geojson", line},
		{"wkb", mustWKB(b, g, binary.LittleEndian)},
		{"ewkb", ewkbBytes},
		{"hex-ewkb", []byte(hex.EncodeToString(ewkbBytes))},
	}
}

func BenchmarkCountPayload(b *testing.B) {
	for _, bc := range benchPayloads(b) {
		b.Run(bc.name, func(b *testing.B) {
			want, err := cost.CountPayload(bc.payload)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.payload)))
			for b.Loop() {
				if n, _ := cost.CountPayload(bc.payload); n != want {
					b.Fatalf("%d vertices, want %d", n, want)
				}
			}
			b.ReportMetric(float64(want), "vertices")
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, bc := range benchPayloads(b) {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.payload)))
			for b.Loop() {
				if _, err := cost.Decode(bc.payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEstimate is the consumer's hot path: reading a stamped count.
func BenchmarkEstimate(b *testing.B) {
	msg := message.NewMessage("m", largestCountry(b))
	msg.Metadata.Set(cost.MetadataKey, "12345")
	est := cost.NewEstimator(cost.FullBudget)
	b.ReportAllocs()
	for b.Loop() {
		if c := est.Estimate(msg); c.Vertices != 12345 {
			b.Fatal(c)
		}
	}
}
