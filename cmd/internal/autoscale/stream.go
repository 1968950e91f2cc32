package autoscale

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/spillway-go/spillway/internal/geodata"
)

// The kinds of burst a stream has.
const (
	BurstPings      = "pings"      // many 1-vertex points: many messages, little work
	BurstBoundaries = "boundaries" // a few country boundaries: few messages, much work
)

// Item is one message of the stream.
type Item struct {
	ID       string
	Body     []byte
	Vertices int
}

// Burst is a group of messages published at once, At after the stream
// starts.
type Burst struct {
	At    time.Duration
	Kind  string
	Items []Item
}

// Vertices is the burst's work.
func (b Burst) Vertices() int64 {
	var n int64
	for _, it := range b.Items {
		n += int64(it.Vertices)
	}
	return n
}

// StreamSpec shapes a stream: a burst every Every for Length, pings and
// boundaries alternating (pings first), each burst's size drawn from its
// range with the seeded generator.
type StreamSpec struct {
	Seed   uint64
	Length time.Duration
	Every  time.Duration
	// Pings and Boundaries are the inclusive ranges of a burst's
	// message count.
	Pings      [2]int
	Boundaries [2]int
	// MinBoundary is the fewest vertices a country boundary has to be
	// used (the repository's countries sample has ten of 1,000 or more).
	MinBoundary int
}

// boundaries returns the countries of at least minVertices vertices,
// largest first.
func boundaries(minVertices int) ([]geodata.Feature, error) {
	fs, err := geodata.Load(geodata.Countries)
	if err != nil {
		return nil, err
	}
	var out []geodata.Feature
	for _, f := range fs {
		if f.Vertices >= minVertices {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("autoscale: no country of %d vertices or more in %s", minVertices, geodata.Countries)
	}
	slices.SortFunc(out, func(a, b geodata.Feature) int { return b.Vertices - a.Vertices })
	return out, nil
}

// Build returns the stream's bursts. The same spec gives the same stream.
func (s StreamSpec) Build() ([]Burst, error) {
	heavy, err := boundaries(s.MinBoundary)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x5b111a7))
	draw := func(r [2]int) int { return r[0] + rng.IntN(r[1]-r[0]+1) }
	var out []Burst
	id := 0
	for i := 0; time.Duration(i)*s.Every < s.Length; i++ {
		b := Burst{At: time.Duration(i) * s.Every, Kind: BurstPings}
		if i%2 == 1 {
			b.Kind = BurstBoundaries
		}
		if b.Kind == BurstPings {
			for range draw(s.Pings) {
				lon, lat := -124+57*rng.Float64(), 25+24*rng.Float64()
				b.Items = append(b.Items, Item{
					ID:       fmt.Sprintf("p%06d", id),
					Body:     fmt.Appendf(nil, `{"type":"Point","coordinates":[%.6f,%.6f]}`, lon, lat),
					Vertices: 1,
				})
				id++
			}
		} else {
			for range draw(s.Boundaries) {
				f := heavy[rng.IntN(len(heavy))]
				b.Items = append(b.Items, Item{ID: fmt.Sprintf("b%06d", id), Body: f.Geometry, Vertices: f.Vertices})
				id++
			}
		}
		out = append(out, b)
	}
	return out, nil
}

// mix is the average message of a stream and of its boundaries.
type mix struct {
	messages         int
	vertices         int64
	boundaryMessages int
	boundaryVertices int64
}

func mixOf(bursts []Burst) mix {
	var m mix
	for _, b := range bursts {
		m.messages += len(b.Items)
		m.vertices += b.Vertices()
		if b.Kind == BurstBoundaries {
			m.boundaryMessages += len(b.Items)
			m.boundaryVertices += b.Vertices()
		}
	}
	return m
}
