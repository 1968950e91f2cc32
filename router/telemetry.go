package router

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/spillway-go/spillway/telemetry"
)

// recordDeadLettered records a message the broker's dead-letter middleware
// moved: counted, and its span marked dead_lettered, with the reason
// malformed (unreadable) or redelivered (delivered more than
// redis.max_deliveries times). The router's wrapper of the middleware
// (redisBackend.deadLetter) calls it only when telemetry is on.
func (r *Router) recordDeadLettered(msg *message.Message, malformed bool) {
	reason := "redelivered"
	if malformed {
		reason = "malformed"
	}
	r.metrics.OnDeadLettered(msg, "", reason)
}

// consumerAttributes returns the per-message attributes of the router's
// consumer spans: the broker's (broker, nil for none) and the handler's
// consumer group. The tracing middleware asks for them only for a span
// that records, so a message whose span does not record never looks up
// its handler or builds the group's name.
func (r *Router) consumerAttributes(broker func(*message.Message) []attribute.KeyValue) func(*message.Message) []attribute.KeyValue {
	return func(msg *message.Message) []attribute.KeyValue {
		var attrs []attribute.KeyValue
		if broker != nil {
			attrs = broker(msg)
		}
		if handler := message.HandlerNameFromCtx(msg.Context()); handler != "" {
			if g := r.back.group(handler); g != "" {
				attrs = append(attrs, semconv.MessagingConsumerGroupName(g))
			}
		}
		return attrs
	}
}

// observe registers the observable metrics (budget, auto-sizing bounds,
// consumer lag) under telemetry.name and builds the lag sampler; Close
// unregisters them.
func (r *Router) observe() error {
	if r.metrics == nil {
		return nil
	}
	name := r.cfg.Telemetry.Name
	un, err := r.metrics.ObserveBudget(name, r.budget)
	if err != nil {
		return fmt.Errorf("router: telemetry: %w", err)
	}
	r.unregister = append(r.unregister, un)
	if err := r.observeInternals(); err != nil {
		return err
	}
	if r.sizer != nil {
		un, err := r.metrics.ObserveBounds(name, r.sizer.Bounds)
		if err != nil {
			return fmt.Errorf("router: telemetry: %w", err)
		}
		r.unregister = append(r.unregister, un)
	}
	if r.cfg.Broker == brokerMemory {
		return nil
	}
	lopts := []telemetry.Option{telemetry.WithLagInterval(r.cfg.Telemetry.LagInterval)}
	if t := r.cfg.Telemetry.LagThreshold; t > 0 {
		lopts = append(lopts, telemetry.WithLagThreshold(t))
	}
	r.lagSampler = telemetry.NewLagSampler(r.sampleLag, lopts...)
	un, err = r.metrics.ObserveLag(name, r.lagSampler)
	if err != nil {
		return fmt.Errorf("router: telemetry: %w", err)
	}
	r.unregister = append(r.unregister, un)
	if err := r.observeBacklog(); err != nil {
		return fmt.Errorf("router: telemetry: %w", err)
	}
	return nil
}

func (r *Router) unregisterMetrics() {
	var errs []error
	for _, un := range r.unregister {
		errs = append(errs, un())
	}
	r.unregister = nil
	if err := errors.Join(errs...); err != nil {
		r.logger.Error("Unregistering metric callbacks", err, nil)
	}
}
