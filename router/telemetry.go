package router

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/telemetry"
)

// deadLettering wraps the broker's dead-letter middleware so a message it
// moves is counted and its span marked dead_lettered, with the reason
// malformed (unreadable) or redelivered (delivered more than
// redis.max_deliveries times).
func (r *Router) deadLettering(dl message.HandlerMiddleware) message.HandlerMiddleware {
	if r.metrics == nil {
		return dl
	}
	m := r.metrics
	maxDeliveries := r.cfg.Redis.WithDefaults().MaxDeliveries
	reasonOf := func(msg *message.Message) string {
		switch {
		case redisbroker.IsMalformed(msg):
			return "malformed"
		case maxDeliveries > 0 && redisbroker.Deliveries(msg) > maxDeliveries:
			return "redelivered"
		}
		return ""
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		next := dl(h)
		return func(msg *message.Message) ([]*message.Message, error) {
			reason := reasonOf(msg)
			if reason == "" {
				return next(msg)
			}
			out, err := next(msg)
			if err == nil {
				m.RecordOutcome(msg, telemetry.OutcomeDeadLettered, "", reason)
			}
			return out, err
		}
	}
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
		sizer := r.sizer
		un, err := r.metrics.ObserveBounds(name, func() telemetry.Bounds {
			b := sizer.Bounds()
			return telemetry.Bounds{Memory: b.MemoryBound, Deadline: b.DeadlineBound, Tail: b.TailBound, Budget: b.Budget, Binding: b.Binding}
		})
		if err != nil {
			return fmt.Errorf("router: telemetry: %w", err)
		}
		r.unregister = append(r.unregister, un)
	}
	if r.cfg.Broker == BrokerMemory {
		return nil
	}
	lopts := []telemetry.LagOption{telemetry.WithLagInterval(r.cfg.Telemetry.LagInterval)}
	if t := r.cfg.Telemetry.LagThreshold; t > 0 {
		lopts = append(lopts, telemetry.WithLagThreshold(t))
	}
	r.lagSampler = telemetry.NewLagSampler(telemetry.LagSourceFunc(r.lagSamples), lopts...)
	un, err = r.metrics.ObserveLag(name, r.lagSampler)
	if err != nil {
		return fmt.Errorf("router: telemetry: %w", err)
	}
	r.unregister = append(r.unregister, un)
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
