package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/telemetry/redistel"
)

// metricsServer serves the metrics recorded through provider in the
// Prometheus text format at url (docs/operations.md).
type metricsServer struct {
	provider *sdkmetric.MeterProvider
	url      string
	srv      *http.Server
}

// serveMetrics listens on addr (host:port; port 0 picks a free one).
func serveMetrics(addr string) (*metricsServer, error) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s := &metricsServer{
		provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter)),
		url:      "http://" + ln.Addr().String() + "/metrics",
		srv:      &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
	}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Close stops serving and shuts the provider down.
func (s *metricsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(s.srv.Shutdown(ctx), s.provider.Shutdown(ctx))
}

// instruments are the demo's telemetry, wired by hand as
// docs/operations.md describes (the router package does this itself).
type instruments struct {
	metrics *telemetry.Metrics
	sampler *telemetry.LagSampler
	undo    []func() error
}

// instrument creates the metrics for the demo's budget and consumer group
// on mp and starts sampling sub's lag every interval.
func instrument(mp metric.MeterProvider, budget *middleware.VertexBudget, sub *redisbroker.Subscriber, interval time.Duration) (*instruments, error) {
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp), telemetry.WithMessagingSystem("redis"))
	if err != nil {
		return nil, err
	}
	src, err := redistel.NewLagSource(sub)
	if err != nil {
		return nil, err
	}
	in := &instruments{metrics: m, sampler: telemetry.NewLagSampler(src, telemetry.WithLagInterval(interval))}
	un, err := m.ObserveBudget("redis-demo", budget)
	if err != nil {
		return nil, err
	}
	in.undo = append(in.undo, un)
	if un, err = m.ObserveLag("redis-demo", in.sampler); err != nil {
		_ = in.Close()
		return nil, err
	}
	in.undo = append(in.undo, un)
	in.sampler.Start()
	return in, nil
}

// Close stops the sampler and unregisters the observers.
func (in *instruments) Close() error {
	errs := []error{in.sampler.Close()}
	for _, un := range in.undo {
		errs = append(errs, un())
	}
	return errors.Join(errs...)
}
