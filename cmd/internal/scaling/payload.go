package scaling

import (
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cmd/internal/demo"
	"github.com/spillway-go/spillway/cost"
)

// payload is one message body and its vertices.
type payload struct {
	body     []byte
	vertices int
}

// payloads holds the bodies of each message cost, built once per sweep
// from the repository's testdata.
type payloads struct {
	byCost map[string][]payload
}

// distinctHeavy is how many different heavy multipolygons a sweep cycles
// through.
const distinctHeavy = 16

func loadPayloads(costs []string, heavyVertices int) (*payloads, error) {
	p := &payloads{byCost: map[string][]payload{}}
	var g *demo.Geometry
	for _, c := range costs {
		if c == CostPing {
			// Points along a line across the continental United States.
			for i := range 1000 {
				lon, lat := -124+57*float64(i)/1000, 25+24*float64(i%97)/97
				p.byCost[c] = append(p.byCost[c], payload{
					body:     fmt.Appendf(nil, `{"type":"Point","coordinates":[%.6f,%.6f]}`, lon, lat),
					vertices: 1,
				})
			}
			continue
		}
		if g == nil {
			var err error
			if g, err = demo.LoadGeometry(); err != nil {
				return nil, err
			}
		}
		switch c {
		case CostPolygon:
			for _, f := range g.Parcels {
				p.byCost[c] = append(p.byCost[c], payload{body: f.Geometry, vertices: f.Vertices})
			}
		case CostHeavy:
			for i := range distinctHeavy {
				b, v, err := g.HeavyPayload(i*len(g.Polygons)/distinctHeavy, heavyVertices)
				if err != nil {
					return nil, err
				}
				p.byCost[c] = append(p.byCost[c], payload{body: b, vertices: v})
			}
		}
	}
	return p, nil
}

// backlog returns n messages of cost c, stamped with their vertex count,
// and their vertices in all.
func (p *payloads) backlog(c string, n int) ([]*message.Message, int64) {
	src := p.byCost[c]
	msgs := make([]*message.Message, n)
	var vertices int64
	for i := range msgs {
		pl := src[i%len(src)]
		m := message.NewMessage(c+"-"+strconv.Itoa(i), pl.body)
		m.Metadata.Set(cost.MetadataKey, strconv.Itoa(pl.vertices))
		msgs[i] = m
		vertices += int64(pl.vertices)
	}
	return msgs, vertices
}
