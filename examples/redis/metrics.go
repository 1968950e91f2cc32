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
)

// metricsServer serves the router's OpenTelemetry metrics in the
// Prometheus text format at /metrics (docs/operations.md).
type metricsServer struct {
	Provider *sdkmetric.MeterProvider // pass to router.WithMeterProvider
	URL      string                   // http://host:port/metrics

	srv  *http.Server
	done chan struct{}
}

// serveMetrics listens on addr (host:port; port 0 picks a free one) and
// serves /metrics from a registry of its own, fed by Provider.
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
	m := &metricsServer{
		Provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter)),
		URL:      "http://" + ln.Addr().String() + "/metrics",
		srv:      &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		done:     make(chan struct{}),
	}
	go func() {
		defer close(m.done)
		_ = m.srv.Serve(ln)
	}()
	return m, nil
}

// Close stops the server and the provider.
func (m *metricsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := m.srv.Shutdown(ctx)
	<-m.done
	return errors.Join(err, m.Provider.Shutdown(ctx))
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
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp), telemetry.WithMessagingSystem(telemetry.SystemRedis))
	if err != nil {
		return nil, err
	}
	in := &instruments{metrics: m, sampler: telemetry.NewLagSampler(sub.LagSource(), telemetry.WithLagInterval(interval))}
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
