// Command redis streams real geometry through Redis Streams into a Watermill
// router with a Spillway vertex budget, and prints what the budget, the
// consumer group and the keep-alive are doing once a second.
//
// By default it runs against an in-process miniredis (Addr "embedded"), so
// it needs nothing installed; set REDIS_ADDR (host:port) to use a real
// server, where the consumer-group lag is exact.
//
//	go run ./examples/redis [-data FILE[,FILE...]] [-budget 8000] [-passes 60] [-consumers 8] [-rate 0] [-metrics-addr 127.0.0.1:9464]
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/redis
//
// The geometry comes from -data: NDJSON files of GeoJSON features, one
// feature a line, comma-separated. The default names the repository's
// countries sample relative to its root, so run it from there or point
// -data at your own files.
//
// With -metrics-addr it serves the budget, processing and lag metrics in
// the Prometheus format at /metrics (docs/operations.md).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	_ "github.com/spillway-go/spillway/embedded" // kafka.brokers / redis.addr "embedded"
	"github.com/spillway-go/spillway/examples/geo"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/redisbroker"
)

const defaultData = "testdata/countries-land-10km.ndjson"

func main() {
	data := flag.String("data", defaultData, "NDJSON files of GeoJSON features, comma-separated")
	budgetVertices := flag.Int64("budget", 8_000, "vertex budget (vertices admitted at once)")
	passes := flag.Int("passes", 60, "reference work passes per message (scales cost per vertex)")
	consumers := flag.Int("consumers", 8, "Redis consumers (subscriptions) in this process: the most messages in flight")
	rate := flag.Int("rate", 0, "messages published per second (0: as fast as possible, a burst)")
	pings := flag.Int("pings", 2, "point pings published per polygon")
	metricsAddr := flag.String("metrics-addr", "", "serve Prometheus metrics at http://<addr>/metrics (host:port, port 0 for any; empty: off)")
	flag.Parse()
	if err := run(*data, *budgetVertices, *passes, *consumers, *rate, *pings, *metricsAddr); err != nil {
		fmt.Fprintln(os.Stderr, "redis demo:", err)
		os.Exit(1)
	}
}

func run(data string, budgetVertices int64, passes, consumers, rate, pings int, metricsAddr string) error {
	features, err := geo.Load(data)
	if err != nil {
		return err
	}

	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = spillway.Embedded
	}
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36) // a fresh stream per run on a shared server
	topic := "spillway.demo.geometry." + suffix
	cfg := redisbroker.Config{
		Addr:            addr,
		Password:        spillway.Secret(os.Getenv("REDIS_PASSWORD")),
		ConsumerGroup:   "spillway-demo",
		Consumers:       consumers,
		DeadLetterTopic: "spillway.demo.deadletter." + suffix,
	}
	if err := cfg.Validate(); err != nil {
		return err
	}

	logger := watermill.NopLogger{}
	redisPub, err := redisbroker.NewPublisher(cfg, redisbroker.WithLogger(logger))
	if err != nil {
		return err
	}
	defer redisPub.Close()
	publisher := cost.NewStampingPublisher(redisPub)
	sub, err := redisbroker.NewSubscriber(cfg, redisbroker.WithLogger(logger))
	if err != nil {
		return err
	}
	dead, err := redisbroker.NewDeadLetter(cfg, redisbroker.WithPublisher(redisPub))
	if err != nil {
		return err
	}
	budget, err := middleware.NewVertexBudget(budgetVertices)
	if err != nil {
		return err
	}
	var mopts []middleware.Option
	var outer []message.HandlerMiddleware // telemetry, outermost first
	if metricsAddr != "" {
		ms, err := serveMetrics(metricsAddr)
		if err != nil {
			return err
		}
		defer ms.Close()
		in, err := instrument(ms.provider, budget, sub, 500*time.Millisecond)
		if err != nil {
			return err
		}
		defer in.Close()
		mopts = append(mopts, middleware.WithOnAdmission(in.metrics.OnAdmission))
		outer = append(outer, in.metrics.Middleware)
		fmt.Printf("metrics: %s\n", ms.url)
	}
	admission, err := middleware.New(budget, mopts...)
	if err != nil {
		return err
	}

	var done, vertices atomic.Int64
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return err
	}
	// Outermost first: malformed entries are dead-lettered before they can
	// be charged; the keep-alive needs no middleware (it runs in the
	// subscriber and covers the wait for budget too).
	router.AddMiddleware(append(outer, dead.Middleware, admission.Middleware)...)
	router.AddConsumerHandler("geometry", topic, sub, func(msg *message.Message) error {
		if _, err := geo.Work(msg.Payload, passes); err != nil {
			return err
		}
		n, _ := strconv.ParseInt(msg.Metadata.Get(cost.MetadataKey), 10, 64)
		vertices.Add(n)
		done.Add(1)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	<-router.Running()

	// Mixed stream: every polygon is followed by a few point pings.
	rng := rand.New(rand.NewPCG(7, 7))
	rng.Shuffle(len(features), func(i, j int) { features[i], features[j] = features[j], features[i] })
	total := len(features) * (1 + pings)
	var totalVertices int64
	for _, f := range features {
		totalVertices += int64(f.Vertices + pings)
	}
	where := addr
	if addr == spillway.Embedded {
		where = "embedded miniredis (set REDIS_ADDR for a real server; miniredis reports no lag)"
	}
	fmt.Printf("Redis: %s, stream %s, group %s, %d consumers\n", where, topic, cfg.ConsumerGroup, consumers)
	fmt.Printf("streaming %d messages (%d polygons, %d pings; %d vertices) through a %d-vertex budget\n",
		total, len(features), len(features)*pings, totalVertices, budgetVertices)
	pubErr := make(chan error, 1)
	go func() { pubErr <- publish(publisher, topic, features, pings, rate, rng) }()

	start := time.Now()
	last := start
	var lastVertices int64
	deadline := start.Add(50 * time.Second)
	fmt.Printf("%6s %9s %12s %17s %8s %8s\n", "t", "messages", "vertices/s", "budget in use", "waiting", "backlog")
	for done.Load() < int64(total) {
		select {
		case err := <-pubErr:
			if err != nil {
				return err
			}
		case err := <-routerDone:
			return fmt.Errorf("router stopped early: %v", err)
		case <-time.After(time.Second):
		}
		now := time.Now()
		v := vertices.Load()
		s := budget.Stats()
		backlog := "-"
		// One XINFO GROUPS per status line, never per message. miniredis
		// reports the stream length as the lag: not shown.
		if n, err := sub.Lag(ctx, topic); err == nil && addr != spillway.Embedded {
			backlog = strconv.FormatInt(n, 10)
		}
		fmt.Printf("%5.0fs %9d %12.0f %8d/%-8d %8d %8s\n",
			now.Sub(start).Seconds(), done.Load(), float64(v-lastVertices)/now.Sub(last).Seconds(),
			s.InUse, s.Capacity, s.Waiting, backlog)
		last, lastVertices = now, v
		if now.After(deadline) {
			return fmt.Errorf("only %d of %d messages processed in %s", done.Load(), total, now.Sub(start).Round(time.Second))
		}
	}
	elapsed := time.Since(start)
	s := budget.Stats()
	st := sub.Stats()
	if err := router.Close(); err != nil {
		return err
	}
	if err := sub.Close(); err != nil {
		return err
	}
	fmt.Printf("\ndone: %d messages, %d vertices in %s (%.0f vertices/s)\n", done.Load(), vertices.Load(),
		elapsed.Round(time.Millisecond), float64(vertices.Load())/elapsed.Seconds())
	fmt.Printf("budget: peak %d of %d vertices, %d admitted, waited %s in all, %d clamped\n",
		s.PeakInUse, s.Capacity, s.Admitted, s.TotalWait.Round(time.Millisecond), s.Clamped)
	fmt.Printf("redis: %d keep-alive refreshes, %d entries lost to peers, %d expired, %d malformed (%d dead-lettered); redelivery deadline %s\n",
		st.Refreshed, st.Lost, st.Expired, st.Malformed, dead.Count(), cfg.WithDefaults().MaxIdleTime)
	return nil
}

func publish(pub message.Publisher, topic string, features []geo.Feature, pings, rate int, rng *rand.Rand) error {
	var tick <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		tick = t.C
	}
	for i, f := range features {
		msgs := []*message.Message{message.NewMessage("poly-"+f.ID+"-"+strconv.Itoa(i), message.Payload(f.Geometry))}
		for p := range pings {
			pt, err := json.Marshal(map[string]any{"type": "Point", "coordinates": []float64{rng.Float64()*360 - 180, rng.Float64()*180 - 90}})
			if err != nil {
				return err
			}
			msgs = append(msgs, message.NewMessage(fmt.Sprintf("ping-%d-%d", i, p), pt))
		}
		for _, m := range msgs {
			if tick != nil {
				<-tick
			}
			if err := pub.Publish(topic, m); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
		}
	}
	return nil
}
