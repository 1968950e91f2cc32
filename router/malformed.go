package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/copyctx"
	"github.com/spillway-go/spillway/internal/errtext"
	"github.com/spillway-go/spillway/retrygate"
)

// malformedCause is the dead-letter cause of a message whose handler said
// its payload cannot be decoded ([cost.IsUndecodable]). The retry gate
// uses the same word.
const malformedCause = "malformed"

// malformedLayer is the budget slot's malformed part, present when the
// retry gate is off (retry.disabled): a message whose handler failed with
// an error that says its payload cannot be decoded ([cost.IsUndecodable])
// is dead-lettered (moveMalformed) and acked, unless its delivery context
// ended or the router is closing. Every other error goes back to the
// broker unchanged, as in plain Watermill. With the gate on, the gate does
// the same.
func (r *Router) malformedLayer(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context() // the context msg arrived with (Router.admitted)
		out, err := h(msg)
		if err == nil || !cost.IsUndecodable(err) || ctx.Err() != nil || r.closingCtx.Err() != nil {
			return out, err
		}
		return nil, r.moveMalformed(ctx, msg, err)
	}
}

// moveMalformed publishes a dead-letter copy of msg, whose handler failed
// with err, with cause malformed, and returns nil to have msg acked
// (nacking it would only have the broker deliver the same bytes again,
// forever); if the copy cannot be published, an error to have it nacked.
// ctx is the context msg arrived with.
func (r *Router) moveMalformed(ctx context.Context, msg *message.Message, err error) error {
	origin := r.originTopic(msg)
	dest := r.cfg.Retry.DeadLetterTopicFor(origin)
	cp := msg.Copy()
	cp.SetContext(copyctx.Of(ctx))
	cp.Metadata.Set(wmw.ReasonForPoisonedKey, errtext.Cut(err))
	cp.Metadata.Set(wmw.PoisonedTopicKey, message.SubscribeTopicFromCtx(ctx))
	cp.Metadata.Set(wmw.PoisonedHandlerKey, message.HandlerNameFromCtx(ctx))
	cp.Metadata.Set(wmw.PoisonedSubscriberKey, message.SubscriberNameFromCtx(ctx))
	cp.Metadata.Set(retrygate.OriginTopicKey, origin)
	cp.Metadata.Set(retrygate.DeadLetterCauseKey, malformedCause)
	fields := watermill.LogFields{
		"message_uuid": msg.UUID, "topic": origin, "handler": message.HandlerNameFromCtx(ctx),
		"dead_letter_topic": dest, "cause": malformedCause,
	}
	if perr := r.publishCopy(dest, cp); perr != nil {
		r.logger.Error("router: cannot publish a malformed message to the dead-letter topic; nacking", perr, fields)
		return errors.Join(err, perr)
	}
	r.logger.Info("router: message dead-lettered: "+errtext.Cut(err), fields)
	if r.metrics != nil {
		r.metrics.OnDeadLettered(msg, origin, malformedCause)
	}
	return nil
}

// publishCopy publishes a retry, dead-letter or oversize copy to topic,
// creating the topic where the broker needs it.
func (r *Router) publishCopy(topic string, cp *message.Message) error {
	if err := r.back.ensureTopic(topic); err != nil {
		return fmt.Errorf("router: topic %q: %w", topic, err)
	}
	if err := r.copies.Publish(topic, cp); err != nil {
		return fmt.Errorf("router: publishing to %q: %w", topic, err)
	}
	return nil
}
