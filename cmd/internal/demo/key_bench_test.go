package demo

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/refwork"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/router"
)

// Benchmarks of kafka.consumer key against partition mode (docs/benchmarks.md,
// "Key mode"), on the embedded broker, each pair in one run:
//
//	go test -run '^$' -bench 'KafkaKey' -benchtime 3000x -count 3 ./internal/demo/
//
// (3,000 messages time about 0.4 s of goodput: on a busy machine use
// -benchtime 20000x for KafkaKeyGoodput, and run rounds in a loop as
// docs/benchmarks.md, "Key mode", does.)
//
// BenchmarkKafkaKeyGoodput: the demo's mixed geometry (one heavy
// multipolygon of 5,000+ vertices in 100 messages, a county parcel in 5,
// pings otherwise) over 1,000 keys, published before the consumer starts;
// the handler runs the reference work (area, centroid, hull) once, or six
// times (-passes6). Key mode on one partition against partition mode on
// twelve, same budget.
//
// BenchmarkKafkaKeyPingLatency: one partition that carries heavy
// multipolygons (one in ten messages) and pings (the rest, each its own
// key), published live at 400 messages/s; p50 and p99 of the pings'
// publish-to-handler latency, partition mode against key mode, with the
// default budget, with a budget of four heavies (with and without a light
// lane), and with heavies that wait instead of computing (heavy=waits).
//
// CPU per message with a no-op handler is BenchmarkKafkaConsume's
// consumer=spillway-key against consumer=spillway.

// keyBenchRouter is a Spillway router on brokers in the given consumer mode
// whose topic has partitions partitions.
func keyBenchRouter(b *testing.B, brokers []string, consumer string, partitions int32, budget int64, topic string, h message.NoPublishHandlerFunc, lanes ...middleware.Lane) *router.Router {
	b.Helper()
	cfg := router.Config{Broker: "kafka"}
	cfg.Telemetry.Disabled = true
	cfg.Budget.Vertices = budget
	cfg.Budget.Lanes = lanes
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.Version = kafkaVersion.String()
	cfg.Kafka.CreateTopics = true
	cfg.Kafka.ConsumerGroup = "bench-" + topic
	cfg.Kafka.Partitions = partitions
	cfg.Kafka.KeyMetadata = MetaEntity
	cfg.Kafka.Consumer = consumer
	r, err := router.New(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := r.AddConsumerHandler("h", topic, h); err != nil {
		b.Fatal(err)
	}
	return r
}

// ensureTopic creates topic with partitions partitions.
func ensureTopic(b *testing.B, brokers []string, topic string, partitions int32) {
	b.Helper()
	cl, err := kafkabroker.New(kafkabroker.Config{Brokers: brokers, Version: kafkaVersion.String(), Partitions: partitions, CreateTopics: true})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	if err := cl.EnsureTopic(topic); err != nil {
		b.Fatal(err)
	}
}

// mixPayloads is the goodput benchmark's geometry: heavies, parcels, pings.
type mixPayloads struct {
	heavy   [][]byte
	parcels [][]byte
}

func loadMix(b *testing.B) mixPayloads {
	b.Helper()
	g, err := LoadGeometry()
	if err != nil {
		b.Fatal(err)
	}
	var m mixPayloads
	for i := range 4 {
		p, _, err := g.HeavyPayload(i*97, 5_000)
		if err != nil {
			b.Fatal(err)
		}
		m.heavy = append(m.heavy, p)
	}
	for _, f := range g.Parcels[:min(len(g.Parcels), 200)] {
		m.parcels = append(m.parcels, f.Geometry)
	}
	return m
}

func (m mixPayloads) payload(i int) []byte {
	switch {
	case i%100 == 0:
		return m.heavy[(i/100)%len(m.heavy)]
	case i%5 == 0:
		return m.parcels[(i/5)%len(m.parcels)]
	default:
		return ping(i)
	}
}

func ping(i int) []byte {
	return fmt.Appendf(nil, `{"type":"Point","coordinates":[%d.5,%d.25]}`, i%180, i%90)
}

func BenchmarkKafkaKeyGoodput(b *testing.B) {
	mix := loadMix(b)
	var seq atomic.Int64
	for _, c := range []struct {
		name       string
		consumer   string
		partitions int32
		passes     int // of the reference work per message
	}{
		{"partition-12p", "partition", 12, 1}, {"key-1p", "key", 1, 1},
		// A handler six times heavier: the work, not the hand-over of
		// one partition's records into the router, is then the limit.
		{"partition-12p-passes6", "partition", 12, 6}, {"key-1p-passes6", "key", 1, 6},
	} {
		b.Run(c.name, func(b *testing.B) {
			// A broker of its own, as in BenchmarkKafkaKeyPingLatency:
			// no sub-benchmark runs on what an earlier one left.
			cl, pub := benchCluster(b, 12)
			topic := fmt.Sprintf("goodput-%s-%d", c.name, seq.Add(1))
			ensureTopic(b, cl.brokers, topic, c.partitions)
			var vertices int64
			for i := 0; i < b.N; i += 500 {
				var msgs []*message.Message
				for j := i; j < min(i+500, b.N); j++ {
					m := message.NewMessage(strconv.Itoa(j), mix.payload(j))
					m.Metadata.Set(MetaEntity, "vehicle-"+strconv.Itoa(j%1000))
					msgs = append(msgs, m)
				}
				if err := pub.Publish(topic, msgs...); err != nil {
					b.Fatal(err)
				}
				for _, m := range msgs {
					v, _ := strconv.ParseInt(m.Metadata.Get(cost.MetadataKey), 10, 64)
					vertices += v
				}
			}
			ct := newConsumeTimer(b.N)
			// A budget sized to the machine rather than to the partitions:
			// four heavy multipolygons, or a few hundred parcels, at once.
			r := keyBenchRouter(b, cl.brokers, c.consumer, c.partitions, 20_000, topic, func(msg *message.Message) error {
				if _, err := refwork.Process(refwork.Full, msg.Payload, c.passes); err != nil {
					return err
				}
				ct.seen()
				return nil
			})
			b.StopTimer()
			elapsed := ct.measure(b, r.Run, r.Close)
			b.ReportMetric(float64(vertices)/elapsed.Seconds(), "vertices/s")
		})
	}
}

func BenchmarkKafkaKeyPingLatency(b *testing.B) {
	mix := loadMix(b)
	const (
		rate   = 400 // messages per second
		warmUp = 800 // messages handled before timing: two seconds
	)
	var seq atomic.Int64
	// budget 200000 (the default) admits every heavy of the window at
	// once; 20000 admits four, so pings also queue behind heavies in the
	// budget (FIFO), whatever the consumer mode. lanes=light: the 20000
	// budget split into a light lane (charges under 1000, a tenth of the
	// budget reserved) and the rest, so pings no longer queue behind
	// heavies for admission.
	light := []middleware.Lane{{Name: "light", MaxCharge: 1000, Reserve: 0.1}, {Name: "heavy"}}
	// heavy=waits: the heavies wait heavyWait instead of computing (about
	// what the reference work takes on one here: partition mode's p99 is
	// 6-8 ms either way), as a heavy that writes to a store would. On two
	// cores that also run the broker and the producer, computing heavies
	// leave the pings one core to share with them; waiting ones leave
	// both, which isolates what the consumer mode itself changes.
	const heavyWait = 6 * time.Millisecond
	for _, c := range []struct {
		consumer string
		budget   int64
		lanes    []middleware.Lane
		waits    bool
	}{{"partition", 200_000, nil, false}, {"key", 200_000, nil, false}, {"partition", 20_000, nil, false}, {"key", 20_000, nil, false},
		{"partition", 20_000, light, false}, {"key", 20_000, light, false},
		{"partition", 200_000, nil, true}, {"key", 200_000, nil, true}} {
		consumer := c.consumer
		name := fmt.Sprintf("budget=%d/consumer=%s", c.budget, consumer)
		switch {
		case c.lanes != nil:
			name = fmt.Sprintf("budget=%d/lanes=light/consumer=%s", c.budget, consumer)
		case c.waits:
			name = fmt.Sprintf("budget=%d/heavy=waits/consumer=%s", c.budget, consumer)
		}
		b.Run(name, func(b *testing.B) {
			// A broker of its own, so that no sub-benchmark runs on what
			// an earlier one left in the process (a broker shared by all
			// of them keeps every earlier run's messages, and key mode's
			// p99 then depended on the sub-benchmark's place in the run).
			cl, pub := benchCluster(b, 1)
			topic := fmt.Sprintf("pings-%s-%d", consumer, seq.Add(1))
			ensureTopic(b, cl.brokers, topic, 1)
			var (
				mu        sync.Mutex
				latencies []time.Duration
				handled   atomic.Int64
				done      = make(chan struct{})
			)
			warm := make(chan struct{})
			var warmed atomic.Int64
			r := keyBenchRouter(b, cl.brokers, consumer, 1, c.budget, topic, func(msg *message.Message) error {
				kind := msg.Metadata.Get("kind")
				switch kind {
				case "warm-up":
					if _, err := refwork.Process(refwork.Full, msg.Payload, 1); err != nil {
						return err
					}
					if warmed.Add(1) == warmUp {
						close(warm)
					}
					return nil
				case "ping":
					sent, _ := strconv.ParseInt(msg.Metadata.Get("sent_ns"), 10, 64)
					mu.Lock()
					latencies = append(latencies, time.Since(time.Unix(0, sent)))
					mu.Unlock()
				}
				if c.waits && kind == "heavy" {
					time.Sleep(heavyWait)
				} else if _, err := refwork.Process(refwork.Full, msg.Payload, 1); err != nil {
					return err
				}
				if handled.Add(1) == int64(b.N) {
					close(done)
				}
				return nil
			}, c.lanes...)
			errc := make(chan error, 1)
			go func() { errc <- r.Run(context.Background()) }()
			<-r.Running()
			// stream publishes n messages at rate, a heavy every tenth,
			// the others pings; warming marks them all "warm-up".
			stream := func(n int, warming bool) {
				tick := time.NewTicker(time.Second / rate)
				defer tick.Stop()
				for i := 0; i < n; i++ {
					<-tick.C
					var payload []byte
					kind := "ping"
					if i%10 == 0 {
						payload, kind = mix.heavy[(i/10)%len(mix.heavy)], "heavy"
					} else {
						payload = ping(i)
					}
					if warming {
						kind = "warm-up"
					}
					m := message.NewMessage(strconv.Itoa(i), payload)
					m.Metadata.Set("kind", kind)
					m.Metadata.Set(MetaEntity, "vehicle-"+strconv.Itoa(i))
					m.Metadata.Set("sent_ns", strconv.FormatInt(time.Now().UnixNano(), 10))
					if err := pub.Publish(topic, m); err != nil {
						b.Fatal(err)
					}
				}
			}
			// The router runs before the group has joined and fetched,
			// and a fresh process collects its small heap often: time
			// the stream only after warmUp messages of the same stream
			// are handled, or the p99 times the start-up.
			stream(warmUp, true)
			select {
			case <-warm:
			case err := <-errc:
				b.Fatalf("router stopped before consuming: %v", err)
			case <-time.After(time.Minute):
				b.Fatal("the warm-up was not consumed within a minute")
			}
			b.ReportAllocs()
			b.ResetTimer()
			stream(b.N, false)
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				b.Fatalf("only %d of %d messages consumed", handled.Load(), b.N)
			}
			b.StopTimer()
			_ = r.Close()
			<-errc
			mu.Lock()
			defer mu.Unlock()
			slices.Sort(latencies)
			if len(latencies) > 0 {
				q := func(p float64) float64 {
					return float64(latencies[int(p*float64(len(latencies)-1))]) / float64(time.Millisecond)
				}
				b.ReportMetric(q(0.5), "p50-ms")
				b.ReportMetric(q(0.99), "p99-ms")
			}
		})
	}
}
