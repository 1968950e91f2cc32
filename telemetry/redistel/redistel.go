package redistel

import (
	"context"
	"errors"

	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/telemetry"
)

// NewLagSource returns a source of sub's consumer-group lag on every
// topic it has subscribed to so far: one sample per stream, Partition -1,
// Lag = redisbroker.Subscriber.Lag (entries not yet delivered plus
// entries pending, the counterpart of Kafka's high-water mark minus the
// committed offset, which also counts in-flight messages).
//
// Each Lag call costs one XINFO GROUPS per stream; run it from a
// telemetry.LagSampler, never per message. An error on any stream fails the
// whole sample. The source is safe for concurrent use; it does not close
// the subscriber. NewLagSource fails if sub is nil.
func NewLagSource(sub *redisbroker.Subscriber) (telemetry.LagSource, error) {
	if sub == nil {
		return nil, errors.New("redistel: nil subscriber")
	}
	src := &lagSource{sub: sub}
	return src.lag, nil
}

// lagSource is the source [NewLagSource] returns.
type lagSource struct {
	sub *redisbroker.Subscriber
}

// lag returns one sample per subscribed stream, sorted by stream (the
// order of Subscriber.Topics).
func (s *lagSource) lag(ctx context.Context) ([]telemetry.LagSample, error) {
	topics := s.sub.Topics()
	group := s.sub.Config().ConsumerGroup
	out := make([]telemetry.LagSample, 0, len(topics))
	for _, t := range topics {
		backlog, err := s.sub.Lag(ctx, t)
		if err != nil {
			return nil, err
		}
		out = append(out, telemetry.LagSample{Topic: t, Group: group, Partition: -1, Lag: backlog})
	}
	return out, nil
}
