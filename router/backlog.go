package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/spillway-go/spillway/telemetry"
)

// Metric names of the backlog in work (docs/operations.md lists them).
const (
	metricBacklogVertices = "spillway.backlog.vertices"
	metricDrainRate       = "spillway.drain.rate"
	metricDrainTime       = "spillway.drain.time"
)

// vertexEstimate is a backend's estimate of one lag sample's vertices,
// and how many of its messages were read for it.
type vertexEstimate struct {
	vertices, sampled int64
}

// Backlog reads, now, each handler's lag per partition (Kafka) or stream
// (Redis), as [Router.Lag] does, with Vertices set to the estimated cost
// of those messages. Divided by [Stats].DrainRate it is how long this
// process alone would take to drain them. It reads the brokers as
// described in docs/operations.md (bounded per partition or stream), so
// call it from time to time, not per message; with telemetry on, the lag
// sampler makes the same estimate every telemetry.lag_interval and exports
// spillway.backlog.vertices, spillway.drain.rate and spillway.drain.time.
// It returns [ErrLagUnknown] on brokers that cannot tell (memory, a
// custom broker).
func (r *Router) Backlog(ctx context.Context) ([]telemetry.LagSample, error) {
	samples, err := r.lagSamples(ctx)
	if err != nil {
		return nil, err
	}
	return r.backlogOf(ctx, samples)
}

// backlogOf returns a copy of samples with their vertices estimated.
func (r *Router) backlogOf(ctx context.Context, samples []telemetry.LagSample) ([]telemetry.LagSample, error) {
	vs, err := r.back.estimateBacklog(ctx, samples, r.unstampedCharge())
	if errors.Is(err, ErrLagUnknown) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("router: backlog: %w", err)
	}
	out := slices.Clone(samples)
	for i := range out {
		out[i].Vertices = vs[i].vertices
	}
	return out, nil
}

// unstampedCharge is what the budget charges a message without a valid
// vertex_count, and so what the backlog counts it as: budget.default_cost,
// or, when that is 0, the whole budget as it is now.
func (r *Router) unstampedCharge() int64 {
	if c := r.cfg.Budget.DefaultCost; c > 0 {
		return c
	}
	return r.budget.Capacity()
}

// drainRate is the auto-sizer's throughput when there is one and it has
// measured, else the admitted vertices per second.
func (r *Router) drainRate() float64 {
	if r.sizer != nil {
		if v := r.sizer.Bounds().VerticesPerSecond; v > 0 {
			return v
		}
	}
	return r.drained.rate(time.Now())
}

// rateMeter measures a counter's rate from its first add, between reads
// at least minRateWindow apart; reads closer together return the last
// rate.
type rateMeter struct {
	mu     sync.Mutex
	count  int64
	at     time.Time // of the last roll, or the first add; zero before
	atN    int64     // count at the last roll
	latest float64
}

const minRateWindow = time.Second

func (m *rateMeter) add(n int64) {
	m.mu.Lock()
	if m.at.IsZero() {
		m.at = time.Now()
	}
	m.count += n
	m.mu.Unlock()
}

func (m *rateMeter) rate(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.at.IsZero() {
		return 0
	}
	if d := now.Sub(m.at); d >= minRateWindow {
		m.latest = float64(m.count-m.atN) / d.Seconds()
		m.at, m.atN = now, m.count
	}
	return m.latest
}

// backlogCache holds the latest backlog the lag sampler estimated and the
// drain rate at that time, for the metrics.
type backlogCache struct {
	mu     sync.Mutex
	latest []telemetry.LagSample
	rate   float64
	at     time.Time
}

func (c *backlogCache) set(b []telemetry.LagSample, rate float64) {
	c.mu.Lock()
	c.latest, c.rate, c.at = b, rate, time.Now()
	c.mu.Unlock()
}

// get returns the latest backlog and rate if they are younger than maxAge.
func (c *backlogCache) get(maxAge time.Duration) ([]telemetry.LagSample, float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > maxAge {
		return nil, 0
	}
	return c.latest, c.rate
}

// sampleLag is the lag sampler's source: the lag samples, and, from the
// same samples, the backlog estimate the metrics export. A failed estimate
// leaves the lag alone; the stale estimate stops being exported after
// three lag intervals.
func (r *Router) sampleLag(ctx context.Context) ([]telemetry.LagSample, error) {
	samples, err := r.lagSamples(ctx)
	if err != nil {
		return nil, err
	}
	rate := r.drainRate() // before the estimate, which can take a while
	b, err := r.backlogOf(ctx, r.back.owned(samples))
	switch {
	case err == nil:
		r.backlog.set(b, rate)
	case !errors.Is(err, ErrLagUnknown) && ctx.Err() == nil:
		r.logger.Error("Estimating the backlog in vertices", err, nil)
	}
	return samples, nil
}

// observeBacklog registers spillway.backlog.vertices, spillway.drain.rate
// and spillway.drain.time, read from the sampler's latest estimate.
func (r *Router) observeBacklog() error {
	m := telemetry.Meter(r.opts.telemetry...)
	vertices, err := m.Int64ObservableGauge(metricBacklogVertices, metric.WithUnit("{vertex}"),
		metric.WithDescription("Estimated vertices of the messages the consumer group has yet to finish, by topic, group and partition."))
	if err != nil {
		return err
	}
	rate, err := m.Float64ObservableGauge(metricDrainRate, metric.WithUnit("{vertex}/s"),
		metric.WithDescription("Vertices per second this process drains over all its handlers, under source (telemetry.name)."))
	if err != nil {
		return err
	}
	drain, err := m.Float64ObservableGauge(metricDrainTime, metric.WithUnit("s"),
		metric.WithDescription("Estimated backlog vertices divided by this process's drain rate, by topic, group and partition."))
	if err != nil {
		return err
	}
	maxAge := 3 * r.cfg.Telemetry.LagInterval
	src := metric.WithAttributeSet(attribute.NewSet(attribute.String("source", r.cfg.Telemetry.Name)))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		latest, r0 := r.backlog.get(maxAge)
		for _, b := range latest {
			attrs := metric.WithAttributeSet(backlogAttributes(b))
			o.ObserveInt64(vertices, b.Vertices, attrs)
			if r0 > 0 {
				o.ObserveFloat64(drain, float64(b.Vertices)/r0, attrs)
			}
		}
		if len(latest) > 0 && r0 > 0 {
			o.ObserveFloat64(rate, r0, src)
		}
		return nil
	}, vertices, rate, drain)
	if err != nil {
		return err
	}
	r.unregister = append(r.unregister, reg.Unregister)
	return nil
}

// backlogAttributes are the lag metrics' attributes: topic, group and,
// on Kafka, partition.
func backlogAttributes(b telemetry.LagSample) attribute.Set {
	if b.Partition < 0 {
		return attribute.NewSet(attribute.String("topic", b.Topic), attribute.String("group", b.Group))
	}
	return attribute.NewSet(attribute.String("topic", b.Topic), attribute.String("group", b.Group),
		attribute.Int("partition", int(b.Partition)))
}
