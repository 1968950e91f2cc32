package cost_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/spillway-go/spillway/cost"
)

func ExampleNewEstimator() {
	payload := []byte(`{"type":"Polygon","coordinates":[[[0,0],[4,0],[4,4],[0,4],[0,0]]]}`)
	est := cost.NewEstimator(cost.FullBudget)

	// The common case: the count was stamped at ingest.
	stamped := message.NewMessage("stamped", payload)
	stamped.Metadata.Set(cost.MetadataKey, "1250")
	c := est.Estimate(stamped)
	fmt.Println(c.Vertices, c.Messages, c.Source)

	// No count: charged the default, the whole budget, never the cheapest.
	unstamped := message.NewMessage("unstamped", payload)
	c = est.Estimate(unstamped)
	fmt.Println(c.Vertices == cost.FullBudget, c.Source)

	// A count that cannot be trusted is treated the same way.
	garbled := message.NewMessage("garbled", payload)
	garbled.Metadata.Set(cost.MetadataKey, "5 vertices")
	c = est.Estimate(garbled)
	fmt.Println(c.Vertices == cost.FullBudget, c.Source)

	// Optionally, the estimator parses the payload itself.
	c = cost.NewEstimator(cost.FullBudget, cost.WithComputeMissing()).Estimate(unstamped)
	fmt.Println(c.Vertices, c.Source)

	// Output:
	// 1250 1 header
	// true missing
	// true malformed
	// 5 computed
}

func ExampleCountPayload() {
	// A square with a triangular hole: 5 + 4 stored coordinates, closing
	// points included.
	polygon := []byte(`{
		"type": "Polygon",
		"coordinates": [
			[[0, 0], [10, 0], [10, 10], [0, 10], [0, 0]],
			[[2, 2], [4, 2], [2, 4], [2, 2]]
		]
	}`)
	n, err := cost.CountPayload(polygon)
	fmt.Println(n, err)

	_, err = cost.CountPayload([]byte("POINT (1 2)"))
	fmt.Println(errors.Is(err, cost.ErrMalformed))

	// Output:
	// 9 <nil>
	// true
}

func ExampleDecode() {
	// Hex-encoded EWKB, as PostGIS prints it: LINESTRING(0 0, 1 1) with
	// SRID 4326.
	g, err := cost.Decode([]byte("0102000020E61000000200000000000000000000000000000000000000000000000000F03F000000000000F03F"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%T SRID %d, %d vertices\n", g, g.SRID(), cost.Vertices(g))

	// Output:
	// *geom.LineString SRID 4326, 2 vertices
}

func ExampleNewStampingPublisher() {
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1}, watermill.NopLogger{})
	received, err := pubSub.Subscribe(context.Background(), "parcels")
	if err != nil {
		fmt.Println(err)
		return
	}

	pub := cost.NewStampingPublisher(pubSub)
	defer pub.Close()

	msg := message.NewMessage("parcel-1", []byte(`{"type":"Feature","properties":{"id":1},
		"geometry":{"type":"LineString","coordinates":[[0,0],[1,1],[2,0]]}}`))
	if err := pub.Publish("parcels", msg); err != nil {
		fmt.Println(err)
		return
	}
	got := <-received
	got.Ack()
	fmt.Printf("%s: %s=%s\n", got.UUID, cost.MetadataKey, got.Metadata.Get(cost.MetadataKey))

	// One payload that is not geometry fails the whole call; nothing is
	// published and no message is modified.
	ok := message.NewMessage("parcel-2", []byte(`{"type":"Point","coordinates":[1,2]}`))
	junk := message.NewMessage("parcel-3", []byte("hello"))
	err = pub.Publish("parcels", ok, junk)
	fmt.Println(errors.Is(err, cost.ErrUnstampable), ok.Metadata.Get(cost.MetadataKey) == "")

	// Output:
	// parcel-1: vertex_count=3
	// true true
}
