// Command memory streams real geometry through a Watermill router on the
// in-process GoChannel with a Spillway vertex budget, and prints what the
// budget is doing once a second.
//
//	go run ./examples/memory [-data FILE[,FILE...]] [-budget 20000] [-passes 60] [-rate 0]
//
// The geometry comes from -data: NDJSON files of GeoJSON features, one
// feature a line, comma-separated. The default names the repository's two
// samples (countries and US counties) relative to its root, so run it from
// there or point -data at your own files.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/examples/geo"
	"github.com/spillway-go/spillway/middleware"
)

const defaultData = "testdata/countries-land-10km.ndjson,testdata/us-counties-10m.ndjson"

func main() {
	data := flag.String("data", defaultData, "NDJSON files of GeoJSON features, comma-separated")
	budgetVertices := flag.Int64("budget", 20_000, "vertex budget (vertices admitted at once)")
	passes := flag.Int("passes", 60, "reference work passes per message (scales cost per vertex)")
	rate := flag.Int("rate", 0, "messages published per second (0: as fast as possible, a burst)")
	pings := flag.Int("pings", 2, "point pings published per polygon")
	flag.Parse()
	if err := run(*data, *budgetVertices, *passes, *rate, *pings); err != nil {
		fmt.Fprintln(os.Stderr, "memory demo:", err)
		os.Exit(1)
	}
}

type stats struct {
	done, vertices atomic.Int64
	mu             sync.Mutex
	maxWait        time.Duration // longest admission wait since the last tick
}

func run(data string, budgetVertices int64, passes, rate, pings int) error {
	features, err := geo.Load(data)
	if err != nil {
		return err
	}

	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	publisher := cost.NewStampingPublisher(pubSub)

	budget, err := middleware.NewVertexBudget(budgetVertices)
	if err != nil {
		return err
	}
	var st stats
	admission, err := middleware.New(budget, middleware.WithOnAdmission(func(_ *message.Message, a middleware.Admission) {
		st.mu.Lock()
		st.maxWait = max(st.maxWait, a.Wait)
		st.mu.Unlock()
	}))
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(admission.Middleware)
	router.AddConsumerHandler("geometry", "geometry", pubSub, func(msg *message.Message) error {
		if _, err := geo.Work(msg.Payload, passes); err != nil {
			return err
		}
		n, _ := strconv.ParseInt(msg.Metadata.Get(cost.MetadataKey), 10, 64)
		st.vertices.Add(n)
		st.done.Add(1)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	// Mixed stream: every polygon is followed by a few point pings.
	rng := rand.New(rand.NewPCG(7, 7))
	rng.Shuffle(len(features), func(i, j int) { features[i], features[j] = features[j], features[i] })
	total := len(features) * (1 + pings)
	var totalVertices int64
	for _, f := range features {
		totalVertices += int64(f.Vertices + pings)
	}
	fmt.Printf("streaming %d messages (%d polygons, %d pings; %d vertices) through a %d-vertex budget\n",
		total, len(features), len(features)*pings, totalVertices, budgetVertices)
	go func() {
		var tick <-chan time.Time
		if rate > 0 {
			t := time.NewTicker(time.Second / time.Duration(rate))
			defer t.Stop()
			tick = t.C
		}
		for i, f := range features {
			msgs := []*message.Message{message.NewMessage("poly-"+f.ID+"-"+strconv.Itoa(i), message.Payload(f.Geometry))}
			for p := range pings {
				pt, _ := json.Marshal(map[string]any{"type": "Point", "coordinates": []float64{rng.Float64()*360 - 180, rng.Float64()*180 - 90}})
				msgs = append(msgs, message.NewMessage(fmt.Sprintf("ping-%d-%d", i, p), pt))
			}
			for _, m := range msgs {
				if tick != nil {
					<-tick
				}
				if err := publisher.Publish("geometry", m); err != nil {
					fmt.Fprintln(os.Stderr, "publish:", err)
				}
			}
		}
	}()

	start := time.Now()
	last := start
	var lastVertices int64
	fmt.Printf("%6s %9s %11s %12s %17s %8s %12s\n", "t", "messages", "vertices", "vertices/s", "budget in use", "waiting", "longest wait")
	for st.done.Load() < int64(total) {
		time.Sleep(time.Second)
		now := time.Now()
		v := st.vertices.Load()
		s := budget.Stats()
		st.mu.Lock()
		longest := max(st.maxWait, s.OldestWait)
		st.maxWait = 0
		st.mu.Unlock()
		fmt.Printf("%5.0fs %9d %11d %12.0f %8d/%-8d %8d %12s\n",
			now.Sub(start).Seconds(), st.done.Load(), v, float64(v-lastVertices)/now.Sub(last).Seconds(),
			s.InUse, s.Capacity, s.Waiting, longest.Round(time.Millisecond))
		last, lastVertices = now, v
	}
	elapsed := time.Since(start)
	s := budget.Stats()
	if err := router.Close(); err != nil {
		return err
	}
	fmt.Printf("\ndone: %d messages, %d vertices in %s (%.0f vertices/s)\n", st.done.Load(), st.vertices.Load(),
		elapsed.Round(time.Millisecond), float64(st.vertices.Load())/elapsed.Seconds())
	fmt.Printf("budget: peak %d of %d vertices, %d admitted, waited %s in all, %d clamped\n",
		s.PeakInUse, s.Capacity, s.Admitted, s.TotalWait.Round(time.Millisecond), s.Clamped)
	return nil
}
