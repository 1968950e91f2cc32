// Package promserve serves OpenTelemetry metrics in the Prometheus text
// format at /metrics, for the examples (docs/operations.md).
package promserve

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

// Server serves the router's OpenTelemetry metrics in the
// Prometheus text format at /metrics (docs/operations.md).
type Server struct {
	Provider *sdkmetric.MeterProvider // pass to router.WithMeterProvider
	URL      string                   // http://host:port/metrics

	srv  *http.Server
	done chan struct{}
}

// Serve listens on addr (host:port; port 0 picks a free one) and
// serves /metrics from a registry of its own, fed by Provider.
func Serve(addr string) (*Server, error) {
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
	m := &Server{
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
func (m *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := m.srv.Shutdown(ctx)
	<-m.done
	return errors.Join(err, m.Provider.Shutdown(ctx))
}
