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
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
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
