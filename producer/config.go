package producer

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
)

// required is the error the constructors return for a nil argument.
func required(param string) error {
	return &spillway.FieldError{Field: param, Value: "nil", Reason: "required"}
}

// messagesContext returns a context that ends when the context of any of
// the messages ends, and a function releasing it.
func messagesContext(messages []*message.Message) (context.Context, func()) {
	var ctxs []context.Context
	for _, msg := range messages {
		if msg != nil {
			ctxs = append(ctxs, msg.Context())
		}
	}
	switch len(ctxs) {
	case 0:
		return context.Background(), func() {}
	case 1:
		return ctxs[0], func() {}
	}
	ctx, cancel := context.WithCancelCause(ctxs[0])
	stops := make([]func() bool, 0, len(ctxs)-1)
	for _, c := range ctxs[1:] {
		stops = append(stops, context.AfterFunc(c, func() { cancel(c.Err()) }))
	}
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel(nil)
	}
}

// sleepCtx waits for d or until ctx ends, whichever comes first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
