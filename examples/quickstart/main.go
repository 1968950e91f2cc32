// Command quickstart is the program of docs/quickstart.md: a Spillway
// router configured by spillway.yaml and SPILLWAY_* variables, indexing a
// few sample geometries, with traces on stderr and metrics on /metrics.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/spillway-go/spillway/cost"
	_ "github.com/spillway-go/spillway/embedded" // kafka.brokers: [embedded]
	"github.com/spillway-go/spillway/router"
	"github.com/spillway-go/spillway/telemetry"
)

var samples = []string{
	`{"type":"Polygon","coordinates":[[[13.40,52.52],[13.41,52.52],[13.41,52.53],[13.40,52.52]]]}`, // a parcel
	`{"type":"Point","coordinates":[13.405,52.521]}`,                                               // a position
}

func main() {
	messages := flag.Int("messages", 20, "sample messages to publish; exit once all are indexed (0: run until Ctrl-C)")
	metricsAddr := flag.String("metrics-addr", "127.0.0.1:9464", "serve Prometheus metrics at http://ADDR/metrics")
	flag.Parse()
	cfg, err := router.LoadConfig("spillway.yaml") // then SPILLWAY_* variables, which win
	check(err)
	traces, err := stdouttrace.New(stdouttrace.WithWriter(os.Stderr))
	check(err)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(traces))
	defer tp.Shutdown(context.Background())
	metrics, err := prometheus.New() // into Prometheus' default registry
	check(err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(metrics))
	defer mp.Shutdown(context.Background())
	go func() { log.Fatal(http.ListenAndServe(*metricsAddr, promhttp.Handler())) }()

	r, err := router.New(cfg, watermill.NewStdLoggerWithOut(os.Stdout, false, false), router.WithTelemetry(telemetry.WithTracerProvider(tp), telemetry.WithMeterProvider(mp)))
	check(err)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var indexed atomic.Int64
	_, err = r.AddConsumerHandler("index", "parcels", func(msg *message.Message) error {
		g, err := cost.Decode(msg.Payload)
		if err != nil {
			return err // dead-lettered as malformed (docs/quickstart.md)
		}
		b := g.Bounds()
		fmt.Printf("indexed %s: %d vertices, bbox [%g %g %g %g]\n", msg.UUID, cost.Vertices(g), b.Min(0), b.Min(1), b.Max(0), b.Max(1))
		if indexed.Add(1) == int64(*messages) {
			stop() // the demo is done: Run returns once in-flight work is finished
		}
		return nil
	})
	check(err)
	go func() {
		<-r.Running()
		for i := range *messages {
			msg := message.NewMessage(fmt.Sprintf("sample-%d", i), []byte(samples[i%len(samples)]))
			check(r.Publisher().Publish("parcels", msg)) // stamps vertex_count
		}
	}()
	check(r.Run(ctx))
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
