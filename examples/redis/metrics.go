package main

import (
	"errors"
	"github.com/spillway-go/spillway/internal/promserve"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/telemetry/redistel"
)

// serveMetrics serves /metrics on addr; see promserve.Serve.
func serveMetrics(addr string) (*promserve.Server, error) { return promserve.Serve(addr) }

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
