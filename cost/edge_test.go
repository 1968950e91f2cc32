package cost_test

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/spillway-go/spillway/cost"
)

// emptyPolygons is a GeoJSON MultiPolygon of n empty polygons: no vertex,
// but decoding it builds n polygons.
func emptyPolygons(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"type":"MultiPolygon","coordinates":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("[[]]")
	}
	b.WriteString("]}")
	return b.Bytes()
}

// Issue 13, item 8: a MultiPolygon of empty polygons was charged 1 vertex
// whatever its size, and a forged vertex_count of 1 was trusted on any
// payload, so decoding memory had no bound in the charge. The stamp counts
// the polygons and rings, and every charge is at least the payload's
// size floor.
func TestEdgeChargeBoundsDecodeMemory(t *testing.T) {
	const n = 100_000
	payload := emptyPolygons(n)

	pubsub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	defer pubsub.Close()
	msg := message.NewMessage("1", payload)
	if err := cost.NewStampingPublisher(pubsub).Publish("t", msg); err != nil {
		t.Fatal(err)
	}
	stamped, err := strconv.ParseInt(msg.Metadata.Get(cost.MetadataKey), 10, 64)
	if err != nil || stamped < n {
		t.Errorf("stamped %q for %d empty polygons, want at least %d", msg.Metadata.Get(cost.MetadataKey), n, n)
	}

	// A forged count of 1 on the same payload: charged for its size.
	forged := message.NewMessage("2", payload)
	forged.Metadata.Set(cost.MetadataKey, "1")
	c := cost.NewEstimator(cost.FullBudget).Estimate(forged)
	if floor := int64(len(payload) / 64); c.Vertices < floor {
		t.Errorf("forged count of 1 on %d bytes charged %d, want at least %d", len(payload), c.Vertices, floor)
	}

	// ComputeMissing prices like the stamp.
	bare := message.NewMessage("3", payload)
	if c := cost.NewEstimator(cost.FullBudget, cost.WithComputeMissing()).Estimate(bare); c.Vertices < n || c.Source != cost.SourceComputed {
		t.Errorf("computed charge %+v, want at least %d", c, n)
	}

	// Honest geometry is charged its count.
	square := []byte(`{"type":"Polygon","coordinates":[[[0,0],[1,0],[1,1],[0,1],[0,0]]]}`)
	ok := message.NewMessage("4", square)
	ok.Metadata.Set(cost.MetadataKey, "5")
	if c := cost.NewEstimator(cost.FullBudget).Estimate(ok); c.Vertices != 5 {
		t.Errorf("honest square charged %d, want 5", c.Vertices)
	}
}
