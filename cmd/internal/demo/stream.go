package demo

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/twpayne/go-geom"
	"github.com/twpayne/go-geom/encoding/wkb"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/geodata"
)

// The two topics of the demo stream.
const (
	// TopicPositions carries vehicle positions: full states, keyed and
	// versioned per vehicle, so a later ping replaces an earlier one. It is
	// the only sheddable topic.
	TopicPositions = "positions"
	// TopicBoundaries carries parcels and heavy multipolygons: every
	// message matters, nothing is ever shed.
	TopicBoundaries = "boundaries"
)

// Metadata keys the generator sets on every message (vertex_count is
// stamped by the publisher).
const (
	MetaEntity      = "entity_id"         // the Kafka key and the shedding entity
	MetaVersion     = "entity_version"    // pings: per-vehicle sequence number
	MetaPriority    = "region_priority"   // pings: 0 (shed first) to 3
	MetaPublishedAt = "demo_published_at" // Unix nanoseconds, set at publish
	MetaFailFirst   = "demo_fail_first"   // "1": the first attempt fails (a downstream blip)
)

// Kind is the kind of a generated message.
type Kind uint8

// The kinds of message in the stream.
const (
	KindPing   Kind = iota // a vehicle position: one vertex
	KindParcel             // a real county polygon: tens of vertices
	KindHeavy              // real polygons assembled into one large multipolygon
)

var kindNames = [...]string{"ping", "parcel", "heavy"}

// String returns "ping", "parcel" or "heavy".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Message is one generated message and when, relative to the start of
// production, it is published.
type Message struct {
	At        time.Duration
	Topic     string
	UUID      string
	Kind      Kind
	Key       string
	Version   uint64 // pings only
	Priority  int    // pings only
	Payload   []byte
	Vertices  int
	FailFirst bool
}

// StreamConfig shapes the generated stream.
type StreamConfig struct {
	Seed          uint64        // same seed, same stream
	Duration      time.Duration // how long production runs
	PingRate      float64       // point pings per second
	Vehicles      int           // distinct vehicles pinging
	ParcelRate    float64       // parcel polygons per second
	Burst         int           // heavy multipolygons in the burst
	BurstAt       time.Duration // when the burst is published
	HeavyVertices int           // vertices per heavy multipolygon (at least)
	Partitions    int           // partitions per topic: the burst is spread over them
	FailRate      float64       // share of pings and parcels whose first attempt fails
}

// Validate reports the first unusable field.
func (c StreamConfig) Validate() error {
	switch {
	case c.Duration <= 0:
		return errors.New("duration must be positive")
	case c.PingRate < 0 || c.ParcelRate < 0:
		return errors.New("rates must not be negative")
	case c.PingRate > 0 && c.Vehicles <= 0:
		return errors.New("vehicles must be positive")
	case c.Burst < 0:
		return errors.New("burst must not be negative")
	case c.Burst > 0 && c.HeavyVertices <= 0:
		return errors.New("heavy vertices must be positive")
	case c.Burst > 0 && (c.BurstAt < 0 || c.BurstAt > c.Duration):
		return fmt.Errorf("burst time %s outside the run (0 to %s)", c.BurstAt, c.Duration)
	case c.Partitions <= 0:
		return errors.New("partitions must be positive")
	case c.FailRate < 0 || c.FailRate >= 1:
		return errors.New("fail rate must be in [0, 1)")
	}
	return nil
}

// Stream is a generated stream, ordered by publish time.
type Stream struct {
	Config   StreamConfig
	Messages []Message
	// Per kind: messages and vertices.
	Count    [3]int
	Vertices [3]int64
}

// TotalVertices is the vertices of every message.
func (s *Stream) TotalVertices() int64 { return s.Vertices[0] + s.Vertices[1] + s.Vertices[2] }

// SteadyVerticesPerSecond is the vertex rate of the steady part of the
// stream (pings and parcels).
func (s *Stream) SteadyVerticesPerSecond() float64 {
	return float64(s.Vertices[KindPing]+s.Vertices[KindParcel]) / s.Config.Duration.Seconds()
}

// Geometry is the real geometry the stream is made of.
type Geometry struct {
	// Parcels are small real polygons (US counties) as GeoJSON.
	Parcels []geodata.Feature
	// Polygons are every polygon of both samples, decoded, to assemble
	// heavy multipolygons from.
	Polygons []*geom.Polygon
}

// LoadGeometry reads the repository's testdata (see internal/geodata for
// how it is found).
func LoadGeometry() (*Geometry, error) {
	g := &Geometry{}
	for _, name := range []string{geodata.Counties, geodata.Countries} {
		fs, err := geodata.Load(name)
		if err != nil {
			return nil, err
		}
		for _, f := range fs {
			d, err := cost.Decode(f.Geometry)
			if err != nil {
				return nil, fmt.Errorf("demo: %s %s: %w", name, f.ID, err)
			}
			switch d := d.(type) {
			case *geom.Polygon:
				g.Polygons = append(g.Polygons, d)
			case *geom.MultiPolygon:
				for i := range d.NumPolygons() {
					g.Polygons = append(g.Polygons, d.Polygon(i))
				}
			}
		}
		if name == geodata.Counties {
			g.Parcels = fs
		}
	}
	if len(g.Parcels) == 0 || len(g.Polygons) == 0 {
		return nil, errors.New("demo: no geometry in testdata")
	}
	return g, nil
}

// Heavy assembles a multipolygon of at least minVertices vertices from
// consecutive real polygons, starting at polygon start.
func (g *Geometry) Heavy(start, minVertices int) *geom.MultiPolygon {
	mp := geom.NewMultiPolygon(geom.XY)
	for i, n := start, 0; n < minVertices; i++ {
		p := g.Polygons[i%len(g.Polygons)]
		if err := mp.Push(p); err != nil {
			panic(err) // every polygon is XY: cannot happen
		}
		n += cost.Vertices(p)
	}
	return mp
}

// HeavyPayload is Heavy as WKB.
func (g *Geometry) HeavyPayload(start, minVertices int) ([]byte, int, error) {
	mp := g.Heavy(start, minVertices)
	b, err := wkb.Marshal(mp, wkb.NDR)
	return b, cost.Vertices(mp), err
}

// vehicle is one simulated vehicle: a position moving along a heading.
type vehicle struct {
	lon, lat, heading, speed float64 // degrees, radians, metres per second
	version                  uint64
	priority                 int
}

// Generate builds the stream for cfg from g. The same seed gives the same
// stream.
func Generate(g *Geometry, cfg StreamConfig) (*Stream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("demo: stream: %w", err)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed))
	s := &Stream{Config: cfg}
	add := func(m Message) {
		m.UUID = fmt.Sprintf("%s-%06d", m.Kind, s.Count[m.Kind])
		s.Count[m.Kind]++
		s.Vertices[m.Kind] += int64(m.Vertices)
		s.Messages = append(s.Messages, m)
	}

	// Vehicles move across the continental United States, each pinging
	// in turn, so each pings every Vehicles/PingRate seconds.
	if n := int(cfg.PingRate * cfg.Duration.Seconds()); n > 0 {
		vs := make([]vehicle, cfg.Vehicles)
		for i := range vs {
			vs[i] = vehicle{
				lon: -124 + rng.Float64()*57, lat: 25 + rng.Float64()*24,
				heading: rng.Float64() * 2 * math.Pi, speed: 8 + rng.Float64()*25,
				priority: rng.IntN(4),
			}
		}
		order := rng.Perm(len(vs))
		step := float64(len(vs)) / cfg.PingRate // seconds between pings of one vehicle
		for i := range n {
			v := &vs[order[i%len(vs)]]
			v.heading += rng.NormFloat64() * 0.2
			d := v.speed * step // metres
			v.lat += d * math.Cos(v.heading) / 111_320
			v.lon += d * math.Sin(v.heading) / (111_320 * math.Cos(v.lat*math.Pi/180))
			v.version++
			add(Message{
				At:        time.Duration(float64(i) / cfg.PingRate * float64(time.Second)),
				Topic:     TopicPositions,
				Kind:      KindPing,
				Key:       "vehicle-" + strconv.Itoa(order[i%len(vs)]),
				Version:   v.version,
				Priority:  v.priority,
				Payload:   fmt.Appendf(nil, `{"type":"Point","coordinates":[%.6f,%.6f]}`, v.lon, v.lat),
				Vertices:  1,
				FailFirst: rng.Float64() < cfg.FailRate,
			})
		}
	}

	// Parcels: real county polygons at a steady rate, a little jittered.
	if n := int(cfg.ParcelRate * cfg.Duration.Seconds()); n > 0 {
		for i := range n {
			f := g.Parcels[rng.IntN(len(g.Parcels))]
			at := (float64(i) + rng.Float64()*0.5) / cfg.ParcelRate
			add(Message{
				At:        time.Duration(at * float64(time.Second)),
				Topic:     TopicBoundaries,
				Kind:      KindParcel,
				Key:       "parcel-" + f.ID,
				Payload:   f.Geometry,
				Vertices:  f.Vertices,
				FailFirst: rng.Float64() < cfg.FailRate,
			})
		}
	}

	// The burst: heavy multipolygons published at once, spread evenly over
	// the partitions so each partition delivers its share at the same time.
	keys := partitionKeys(TopicBoundaries, cfg.Partitions)
	for i := range cfg.Burst {
		p, v, err := g.HeavyPayload(rng.IntN(len(g.Polygons)), cfg.HeavyVertices)
		if err != nil {
			return nil, err
		}
		add(Message{
			At:       cfg.BurstAt,
			Topic:    TopicBoundaries,
			Kind:     KindHeavy,
			Key:      keys[i%len(keys)],
			Payload:  p,
			Vertices: v,
		})
	}

	slices.SortStableFunc(s.Messages, func(a, b Message) int {
		switch {
		case a.At < b.At:
			return -1
		case a.At > b.At:
			return 1
		}
		return 0
	})
	return s, nil
}

// partitionKeys returns, for each partition of topic, a key that Sarama's
// default (hash) partitioner sends there.
func partitionKeys(topic string, partitions int) []string {
	keys := make([]string, partitions)
	part := sarama.NewHashPartitioner(topic)
	for i, found := 0, 0; found < partitions; i++ {
		k := "region-" + strconv.Itoa(i)
		p, err := part.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(k)}, int32(partitions))
		if err != nil {
			panic(err) // the hash partitioner does not fail
		}
		if keys[p] == "" {
			keys[p] = k
			found++
		}
	}
	return keys
}
