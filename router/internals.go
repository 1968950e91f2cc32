package router

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/telemetry"
)

// Metric names of the router's inner layers that no library type exports
// on its own (docs/operations.md lists them): how long the producer
// section made Publisher wait, what the rate limit refused, the retry
// budget's tokens, and the Redis keep-alive's work.
const (
	metricProducerWait       = "spillway.producer.wait"
	metricProducerThrottled  = "spillway.producer.throttled"
	metricProducerRejected   = "spillway.producer.rejected"
	metricRetryTokens        = "spillway.retry.tokens"
	metricKeepAliveTracked   = "spillway.redis.keep_alive.tracked"
	metricKeepAliveRefreshed = "spillway.redis.keep_alive.refreshed"
	metricKeepAliveLost      = "spillway.redis.keep_alive.lost"
	metricKeepAliveErrors    = "spillway.redis.keep_alive.errors"
	metricKafkaWindowRecords = "spillway.kafka.window.records"
	metricKafkaWindowBytes   = "spillway.kafka.window.bytes"
	metricKafkaAheadRecords  = "spillway.kafka.readahead.records"
	metricKafkaAheadBytes    = "spillway.kafka.readahead.bytes"
)

// observeInternals registers the observable series of the producer
// section, the retry budget and the Redis keep-alive, read from Stats and
// the Redis subscribers at each collection, under telemetry.name.
func (r *Router) observeInternals() error {
	m := telemetry.Meter(r.opts.telemetry...)
	var insts []metric.Observable
	add := func(o metric.Observable, err error) error {
		if err == nil {
			insts = append(insts, o)
		}
		return err
	}
	wait, err := m.Float64ObservableCounter(metricProducerWait, metric.WithUnit("s"),
		metric.WithDescription("Time Router.Publisher calls spent waiting in the producer section, by limiter (rate_limit, lag_throttle)."))
	if err := add(wait, err); err != nil {
		return err
	}
	throttled, err := m.Int64ObservableCounter(metricProducerThrottled, metric.WithUnit("{call}"),
		metric.WithDescription("Router.Publisher calls the lag throttle made wait."))
	if err := add(throttled, err); err != nil {
		return err
	}
	rejected, err := m.Int64ObservableCounter(metricProducerRejected, metric.WithUnit("{call}"),
		metric.WithDescription("Router.Publisher calls the rate limit refused (mode reject)."))
	if err := add(rejected, err); err != nil {
		return err
	}
	tokens, err := m.Float64ObservableGauge(metricRetryTokens, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries the retry budget would grant now."))
	if err := add(tokens, err); err != nil {
		return err
	}
	tracked, err := m.Int64ObservableGauge(metricKeepAliveTracked, metric.WithUnit("{entry}"),
		metric.WithDescription("Redis entries the keep-alive holds for this router's consumers."))
	if err := add(tracked, err); err != nil {
		return err
	}
	refreshed, err := m.Int64ObservableCounter(metricKeepAliveRefreshed, metric.WithUnit("{entry}"),
		metric.WithDescription("Keep-alive refreshes of held Redis entries."))
	if err := add(refreshed, err); err != nil {
		return err
	}
	lost, err := m.Int64ObservableCounter(metricKeepAliveLost, metric.WithUnit("{entry}"),
		metric.WithDescription("Held Redis entries the keep-alive lost, by reason (claimed: a peer claimed it; expired: max_in_flight; revoked: every revocation)."))
	if err := add(lost, err); err != nil {
		return err
	}
	errs, err := m.Int64ObservableCounter(metricKeepAliveErrors, metric.WithUnit("{call}"),
		metric.WithDescription("Keep-alive refresh calls that failed."))
	if err := add(errs, err); err != nil {
		return err
	}

	winRecords, err := m.Int64ObservableGauge(metricKafkaWindowRecords, metric.WithUnit("{record}"),
		metric.WithDescription("Kafka records read and not yet finished in the window of each partition this router owns (kafka.consumer key)."))
	if err := add(winRecords, err); err != nil {
		return err
	}
	winBytes, err := m.Int64ObservableGauge(metricKafkaWindowBytes, metric.WithUnit("By"),
		metric.WithDescription("Bytes of the Kafka records in the window of each partition (kafka.consumer key)."))
	if err := add(winBytes, err); err != nil {
		return err
	}
	aheadRecords, err := m.Int64ObservableGauge(metricKafkaAheadRecords, metric.WithUnit("{record}"),
		metric.WithDescription("Kafka records read ahead of the window of each partition this router owns, waiting for room (kafka.consumer key)."))
	if err := add(aheadRecords, err); err != nil {
		return err
	}
	aheadBytes, err := m.Int64ObservableGauge(metricKafkaAheadBytes, metric.WithUnit("By"),
		metric.WithDescription("Bytes of the Kafka records read ahead of the window of each partition (kafka.consumer key)."))
	if err := add(aheadBytes, err); err != nil {
		return err
	}

	name := attribute.String("budget", r.cfg.Telemetry.Name)
	set := func(kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributes(append([]attribute.KeyValue{name}, kv...)...)
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := r.Stats()
		if rl := st.RateLimit; rl != nil {
			o.ObserveFloat64(wait, rl.Waited.Seconds(), set(attribute.String("limiter", "rate_limit")))
			o.ObserveInt64(rejected, int64(rl.Rejected), set())
		}
		if lt := st.LagThrottle; lt != nil {
			o.ObserveFloat64(wait, lt.Waited.Seconds(), set(attribute.String("limiter", "lag_throttle")))
			o.ObserveInt64(throttled, int64(lt.Throttled), set())
		}
		if st.Retry != nil {
			o.ObserveFloat64(tokens, st.Retry.RetryTokens, set())
		}
		if ka, ok := r.back.keepAlive(); ok {
			o.ObserveInt64(tracked, int64(ka.Tracked), set())
			o.ObserveInt64(refreshed, int64(ka.Refreshed), set())
			o.ObserveInt64(lost, int64(ka.Lost), set(attribute.String("reason", "claimed")))
			o.ObserveInt64(lost, int64(ka.Expired), set(attribute.String("reason", "expired")))
			o.ObserveInt64(lost, int64(ka.Revoked), set(attribute.String("reason", "revoked")))
			o.ObserveInt64(errs, int64(ka.RefreshErrors), set())
		}
		r.back.keyWindows(func(group string, kt *kafkabroker.SessionTracker) {
			observe := func(records, bytes metric.Int64Observable) func(string, int32, int64, int64) {
				return func(topic string, partition int32, n, size int64) {
					at := set(attribute.String("topic", topic), attribute.String("group", group), attribute.Int("partition", int(partition)))
					o.ObserveInt64(records, n, at)
					o.ObserveInt64(bytes, size, at)
				}
			}
			kt.PartitionWindows(observe(winRecords, winBytes))
			kt.PartitionReadAheads(observe(aheadRecords, aheadBytes))
		})
		return nil
	}, insts...)
	if err != nil {
		return fmt.Errorf("router: telemetry: %w", err)
	}
	r.unregister = append(r.unregister, reg.Unregister)
	return nil
}
