package retrygate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/spillway-go/spillway/internal/errtext"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.opentelemetry.io/otel/trace"
)

// consumeOnce runs mw around h for each msg, consumed from topic by a
// Watermill router (which puts the topic in the message context), and
// returns once each has been acked or nacked.
func consumeOnce(t *testing.T, topic string, mw message.HandlerMiddleware, h message.NoPublishHandlerFunc, msgs ...*message.Message) {
	t.Helper()
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer ps.Close()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(len(msgs))
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			defer wg.Done()
			return h(m)
		}
	}, mw)
	r.AddConsumerHandler("h", topic, ps, h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(context.Background())
	}()
	<-r.Running()
	if err := ps.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	_ = r.Close()
	<-done
}

// A message consumed from "orders" that carries another topic's origin key
// (a handler or producer copied it) is retried and dead-lettered as an
// "orders" message; the key is trusted only on "payments"'s own retry topic
// (issue 13, item 1).
func TestEdgeOriginTrustedOnlyOnItsRetryTopic(t *testing.T) {
	cfg := noJitter()
	cfg.RetryTopic, cfg.DeadLetterTopic = "{topic}.retry", "{topic}.dead_letter"
	pub := newRecPub(nil)
	g := mustNew(t, pub, cfg, WithPressure(saturated{}))
	h := func(m *message.Message) error {
		if m.UUID == "forged-dl" {
			return Permanent(errTransient)
		}
		return errTransient
	}

	// Saturated: a failure is deferred to the retry topic; a permanent one
	// is dead-lettered.
	forged, forgedDL := newMsg("forged"), newMsg("forged-dl")
	forged.Metadata.Set(OriginTopicKey, "payments")
	forgedDL.Metadata.Set(OriginTopicKey, "payments")
	consumeOnce(t, "orders", g.Middleware, h, forged, forgedDL)
	if n := len(pub.on("payments.retry")) + len(pub.on("payments.dead_letter")); n != 0 {
		t.Errorf("%d messages sent to payments' topics by a forged origin key", n)
	}
	got := pub.on("orders.retry")
	if len(got) != 1 || got[0].Metadata.Get(OriginTopicKey) != "orders" {
		t.Fatalf("orders.retry = %v, want the message with origin orders", got)
	}
	if n := len(pub.on("orders.dead_letter")); n != 1 {
		t.Errorf("%d messages on orders.dead_letter, want 1", n)
	}

	// A genuine retry copy, consumed from payments.retry, keeps its origin.
	real := newMsg("real")
	real.Metadata.Set(OriginTopicKey, "payments")
	real.Metadata.Set(attemptKey, "1")
	consumeOnce(t, "payments.retry", g.Middleware, h, real)
	if got := pub.on("payments.retry"); len(got) != 1 || got[0].Metadata.Get(OriginTopicKey) != "payments" {
		t.Errorf("payments.retry = %v, want the genuine retry copy", got)
	}
}

// saturated is a Pressure that always reports saturation.
type saturated struct{}

func (saturated) SaturatedFor() time.Duration { return time.Hour }

// An error that wraps context.Canceled while the message context is alive
// is a failure like any other: it counts an attempt and ends in the
// dead-letter topic, instead of being nacked forever (issue 13, item 10).
func TestEdgeWrappedCanceledIsAFailure(t *testing.T) {
	cfg := noJitter()
	cfg.InitialInterval, cfg.MaxInterval = time.Millisecond, time.Millisecond
	cfg.MaxAttempts = 3
	pub := newRecPub(nil)
	ev := &events{}
	g := mustNew(t, pub, cfg, WithOnOutcome(ev.add))
	var runs atomic.Int64
	err := call(g.Middleware, func(*message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return nil, fmt.Errorf("geocoder client: %w", context.Canceled)
	}, newMsg("c"))
	if err != nil {
		t.Fatalf("err = %v, want the message dead-lettered (nil)", err)
	}
	if runs.Load() != 3 || len(pub.on("dlq")) != 1 {
		t.Fatalf("runs = %d, dead letters = %d; want 3, 1", runs.Load(), len(pub.on("dlq")))
	}
	if e := lastEvent(t, ev); e.Outcome != DeadLettered || e.Cause != causeAttemptsExhausted {
		t.Fatalf("event = %+v, want dead-lettered, attempts exhausted", e)
	}
}

// Handler error text copied into a copy's metadata is bounded, valid UTF-8
// and marked as cut (issue 13, item 11).
func TestEdgeErrorTextBounded(t *testing.T) {
	huge := errors.New(strings.Repeat("é", 1<<20)) // 2 MiB of text
	pub := newRecPub(nil)
	cfg := noJitter()
	g := mustNew(t, pub, cfg, WithPressure(saturated{}))
	fail := func(*message.Message) ([]*message.Message, error) { return nil, huge }
	if err := call(g.Middleware, fail, newMsg("r")); err != nil {
		t.Fatal(err)
	}
	perm := func(*message.Message) ([]*message.Message, error) { return nil, Permanent(huge) }
	if err := call(g.Middleware, perm, newMsg("d")); err != nil {
		t.Fatal(err)
	}
	check := func(what, v string) {
		t.Helper()
		if len(v) == 0 || len(v) > errtext.Max || !utf8.ValidString(v) || !strings.HasSuffix(v, "(truncated)") {
			t.Errorf("%s: %d bytes, valid UTF-8 %t, suffix %q", what, len(v), utf8.ValidString(v), v[max(0, len(v)-20):])
		}
	}
	r, d := pub.on("retry"), pub.on("dlq")
	if len(r) != 1 || len(d) != 1 {
		t.Fatalf("retry %d, dead letters %d; want 1, 1", len(r), len(d))
	}
	check("retry "+lastErrorKey, r[0].Metadata.Get(lastErrorKey))
	check("dead letter "+wmw.ReasonForPoisonedKey, d[0].Metadata.Get(wmw.ReasonForPoisonedKey))

	short := errors.New("short")
	if got := errtext.Cut(short); got != "short" {
		t.Errorf("errtext.Cut(short) = %q", got)
	}
}

// Retry and dead-letter copies carry the delivery's trace context: the
// span in the message context is the one the copy is published with
// (issue 13, item 13).
func TestEdgeCopiesCarryTraceContext(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled,
	})
	for _, perm := range []bool{false, true} {
		var seen trace.SpanContext
		pub := &ctxPub{f: func(m *message.Message) { seen = trace.SpanContextFromContext(m.Context()) }}
		g := mustNew(t, pub, noJitter(), WithPressure(saturated{}))
		ctx, cancel := context.WithCancel(trace.ContextWithSpanContext(context.Background(), sc))
		msg := newMsg("t")
		msg.SetContext(ctx)
		err := call(g.Middleware, func(*message.Message) ([]*message.Message, error) {
			if perm {
				return nil, Permanent(errTransient)
			}
			return nil, errTransient
		}, msg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if !seen.Equal(sc) {
			t.Errorf("permanent %t: copy published with span context %v, want the delivery's %v", perm, seen, sc)
		}
	}
}

// ctxPub calls f with each message it is asked to publish.
type ctxPub struct{ f func(*message.Message) }

func (p *ctxPub) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		p.f(m)
	}
	return nil
}

func (p *ctxPub) Close() error { return nil }
