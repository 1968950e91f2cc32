package router

import (
	"context"
	"errors"
	"fmt"
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

// Backlog is the work a handler's consumer group has yet to do on one
// Kafka partition or Redis stream, as [Router.Backlog] reports it.
type Backlog struct {
	Topic string // the Kafka topic or the Redis stream
	Group string // the handler's consumer group
	// Partition is the Kafka partition, or -1 for a Redis stream.
	Partition int32
	// Messages is the lag in messages, as [Router.Lag] counts it.
	Messages int64
	// Vertices is the estimated backlog in vertices: the vertex_count of
	// the messages read for the estimate, scaled to Messages (see
	// docs/operations.md for what is read and how wrong it can be).
	Vertices int64
	// Sampled is how many of the Messages were read for the estimate;
	// Sampled == Messages means Vertices is exact.
	Sampled int64
	// DrainRate is the vertices per second this process drains: the
	// auto-sizer's measured throughput when budget.autosize is on,
	// otherwise the vertices the budget admitted per second, measured
	// between estimates, over all of the router's handlers. 0 until
	// measured.
	DrainRate float64
	// DrainTime is Vertices ÷ DrainRate: how long this process alone
	// would take to drain the backlog. 0 when the backlog is empty or the
	// rate is not measured yet.
	DrainTime time.Duration
}

// vertexEstimate is a backend's estimate of one lag sample's vertices.
type vertexEstimate struct {
	vertices, sampled int64
}

// backlogEstimator is implemented by the backends that can read what their
// backlog costs (Kafka and Redis): one estimate per lag sample, in order.
type backlogEstimator interface {
	estimateBacklog(ctx context.Context, samples []telemetry.LagSample) ([]vertexEstimate, error)
}

// Backlog reads, now, each handler's lag per partition (Kafka) or stream
// (Redis) together with its estimated cost in vertices, this process's
// drain rate and the resulting drain time. It reads the brokers as
// described in docs/operations.md (bounded per partition or stream), so
// call it from time to time, not per message; with telemetry on, the lag
// sampler calls it every telemetry.lag_interval and exports the result as
// spillway.backlog.vertices, spillway.drain.rate and spillway.drain.time.
// It returns [ErrLagUnknown] on brokers that cannot tell (memory, a
// custom broker).
func (r *Router) Backlog(ctx context.Context) ([]Backlog, error) {
	samples, err := r.lagSamples(ctx)
	if err != nil {
		return nil, err
	}
	return r.backlogOf(ctx, samples)
}

// backlogOf estimates the vertices of samples and adds the drain rate.
func (r *Router) backlogOf(ctx context.Context, samples []telemetry.LagSample) ([]Backlog, error) {
	est, ok := r.back.(backlogEstimator)
	if !ok {
		return nil, ErrLagUnknown
	}
	vs, err := est.estimateBacklog(ctx, samples)
	if err != nil {
		return nil, fmt.Errorf("router: backlog: %w", err)
	}
	rate := r.drainRate()
	out := make([]Backlog, len(samples))
	for i, s := range samples {
		b := Backlog{Topic: s.Topic, Group: s.Group, Partition: s.Partition, Messages: max(s.Lag, 0),
			Vertices: vs[i].vertices, Sampled: vs[i].sampled, DrainRate: rate}
		if rate > 0 && b.Vertices > 0 {
			b.DrainTime = time.Duration(float64(b.Vertices) / rate * float64(time.Second))
		}
		out[i] = b
	}
	return out, nil
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

// backlogCache holds the latest backlog the lag sampler estimated, for the
// metrics.
type backlogCache struct {
	mu     sync.Mutex
	latest []Backlog
	at     time.Time
}

func (c *backlogCache) set(b []Backlog) {
	c.mu.Lock()
	c.latest, c.at = b, time.Now()
	c.mu.Unlock()
}

// get returns the latest backlog if it is younger than maxAge.
func (c *backlogCache) get(maxAge time.Duration) []Backlog {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > maxAge {
		return nil
	}
	return c.latest
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
	b, err := r.backlogOf(ctx, samples)
	switch {
	case err == nil:
		r.backlog.set(b)
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
		latest := r.backlog.get(maxAge)
		for _, b := range latest {
			attrs := metric.WithAttributeSet(backlogAttributes(b))
			o.ObserveInt64(vertices, b.Vertices, attrs)
			if b.DrainRate > 0 {
				o.ObserveFloat64(drain, b.DrainTime.Seconds(), attrs)
			}
		}
		if len(latest) > 0 && latest[0].DrainRate > 0 {
			o.ObserveFloat64(rate, latest[0].DrainRate, src)
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
func backlogAttributes(b Backlog) attribute.Set {
	if b.Partition < 0 {
		return attribute.NewSet(attribute.String("topic", b.Topic), attribute.String("group", b.Group))
	}
	return attribute.NewSet(attribute.String("topic", b.Topic), attribute.String("group", b.Group),
		attribute.Int("partition", int(b.Partition)))
}
