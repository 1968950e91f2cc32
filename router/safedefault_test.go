package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twpayne/go-geom"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/retrygate"
)

// lineLogger counts the lines a logger at its usual level (info and
// above) would print, across every logger made from it with With.
type lineLogger struct {
	mu    *sync.Mutex
	lines *[]string
}

func newLineLogger() lineLogger { return lineLogger{mu: new(sync.Mutex), lines: new([]string)} }

func (l lineLogger) add(level, msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := level + " " + msg
	if err != nil {
		line += ": " + err.Error()
	}
	*l.lines = append(*l.lines, fmt.Sprintf("%s %v", line, fields))
}

func (l lineLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.add("ERROR", msg, err, fields)
}
func (l lineLogger) Info(msg string, fields watermill.LogFields)      { l.add("INFO", msg, nil, fields) }
func (l lineLogger) Debug(string, watermill.LogFields)                {}
func (l lineLogger) Trace(string, watermill.LogFields)                {}
func (l lineLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l lineLogger) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), *l.lines...)
}

// errIndex is what the index of the acceptance test fails with for the
// geometry it can never index.
var errIndex = errors.New("index: geometry rejected")

// TestDefaultConfigBoundsEveryFate is the first hour of a new user, on
// each broker: the README's handler (decode, then index), one partition
// and one consumer, the default configuration. Among 20 good messages are
// one whose payload cannot be decoded and one that the index always
// rejects. The good ones are all handled within 5 s of being published,
// each bad one reaches the dead-letter topic exactly once with its cause
// (malformed, attempts_exhausted), and the whole run logs fewer than 50
// lines. Before the retry gate was on by default, the failing message was
// redelivered without end and the messages behind it on its partition
// never ran.
func TestDefaultConfigBoundsEveryFate(t *testing.T) {
	for _, bc := range []struct {
		name   string
		config func(t *testing.T) Config
	}{
		{"memory", func(*testing.T) Config { return Config{Broker: brokerMemory} }},
		{"kafka", func(*testing.T) Config {
			c := Config{Broker: brokerKafka}
			c.Kafka.Brokers = []string{spillway.Embedded}
			c.Kafka.Partitions = 1
			return c
		}},
		{"redis", func(t *testing.T) Config {
			c := redisConfig(t)
			c.Redis.Consumers = 1
			return c
		}},
	} {
		t.Run(bc.name, func(t *testing.T) {
			cfg := bc.config(t)
			logger := newLineLogger()
			r, err := New(cfg, logger)
			if err != nil {
				t.Fatal(err)
			}
			const topic = "parcels"
			var good atomic.Int64
			index := func(g geom.T) error {
				if p, ok := g.(*geom.Point); ok && p.X() == 666 {
					return errIndex
				}
				good.Add(1)
				return nil
			}
			// The README's handler.
			if _, err := r.AddConsumerHandler("parcels", topic, func(msg *message.Message) error {
				g, err := cost.Decode(msg.Payload)
				if err != nil {
					return err
				}
				return index(g)
			}); err != nil {
				t.Fatal(err)
			}
			dead := watchTopic(t, r, cfg.Retry.DeadLetterTopicFor(topic))
			startRouter(t, r)

			start := time.Now()
			publish := func(pub message.Publisher, uuid string, payload []byte) {
				t.Helper()
				if err := pub.Publish(topic, message.NewMessage(uuid, payload)); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 20 {
				switch i {
				case 5: // a producer outside Spillway: nothing to stamp
					publish(r.back.publisher(), "malformed", []byte(`{"type":"Polygon","coordinates":[[1,2],`))
				case 10:
					publish(r.Publisher(), "rejected", []byte(`{"type":"Point","coordinates":[666,0]}`))
				}
				publish(r.Publisher(), fmt.Sprintf("good-%d", i), pingPayload(i))
			}
			for good.Load() < 20 {
				if time.Since(start) > 5*time.Second {
					t.Fatalf("%d of 20 good messages handled after %s", good.Load(), time.Since(start))
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("20 good messages handled in %s", time.Since(start).Round(time.Millisecond))

			want := map[string]string{"malformed": "malformed", "rejected": "attempts_exhausted"}
			dead.wait(t, len(want), 10*time.Second)
			time.Sleep(time.Second) // and nothing more
			got := dead.all()
			seen := make(map[string]int)
			for _, m := range got {
				seen[m.UUID]++
				if c := m.Metadata.Get(retrygate.DeadLetterCauseKey); c != want[m.UUID] {
					t.Errorf("%s dead-lettered with cause %q, want %q", m.UUID, c, want[m.UUID])
				}
			}
			for uuid := range want {
				if seen[uuid] != 1 {
					t.Errorf("%s dead-lettered %d times, want once", uuid, seen[uuid])
				}
			}
			if len(got) != len(want) {
				t.Errorf("dead-lettered %d messages, want %d", len(got), len(want))
			}
			if lines := logger.Lines(); len(lines) >= 50 {
				t.Errorf("%d log lines, want fewer than 50; the first:\n%s", len(lines), strings.Join(lines[:10], "\n"))
			} else {
				t.Logf("%d log lines", len(lines))
			}
		})
	}
}

// topicWatch collects the messages published to one topic.
type topicWatch struct {
	mu   sync.Mutex
	msgs []*message.Message
}

// watchTopic subscribes to topic on r's broker, in a group of its own,
// until the test ends.
func watchTopic(t *testing.T, r *Router, topic string) *topicWatch {
	t.Helper()
	if err := r.back.ensureTopic(topic); err != nil {
		t.Fatal(err)
	}
	sub, _, err := r.back.subscriber("watch", topic)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &topicWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			w.mu.Lock()
			w.msgs = append(w.msgs, m)
			w.mu.Unlock()
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		<-done
	})
	return w
}

func (w *topicWatch) all() []*message.Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*message.Message(nil), w.msgs...)
}

// wait returns once n messages have been seen, or after d.
func (w *topicWatch) wait(t *testing.T, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for len(w.all()) < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRepeatedErrorsLogBounded: with the retry gate off, a message that
// fails forever is redelivered forever, but Watermill's line for each
// failure is limited: a burst, then one line per interval, and the next
// line says how many were left out.
func TestRepeatedErrorsLogBounded(t *testing.T) {
	cfg := Config{Broker: brokerMemory}
	cfg.Retry.Disabled = true
	logger := newLineLogger()
	r, err := New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	if _, err := r.AddConsumerHandler("h", "t", func(*message.Message) error {
		runs.Add(1)
		return errIndex
	}); err != nil {
		t.Fatal(err)
	}
	startRouter(t, r)
	if err := r.Publisher().Publish("t", message.NewMessage("loops", pingPayload(0))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "1,000 failed runs", func() bool { return runs.Load() >= 1_000 })
	var failures []string
	for _, l := range logger.Lines() {
		if strings.Contains(l, errIndex.Error()) {
			failures = append(failures, l)
		}
	}
	if len(failures) != errorBurst {
		t.Fatalf("%d error lines for %d failed runs, want %d (the burst):\n%s", len(failures), runs.Load(), errorBurst, strings.Join(failures, "\n"))
	}
	if len(logger.Lines()) >= 50 {
		t.Errorf("%d log lines, want fewer than 50", len(logger.Lines()))
	}
	said := 0
	for _, l := range logger.Lines() {
		if strings.Contains(l, "retry gate off (retry.disabled)") {
			said++
		}
	}
	if said != 1 {
		t.Errorf("the router said %d times that the retry gate is off, want once", said)
	}
}

// TestLimitedLoggerCountsSuppressed: after the burst, one line per
// interval and kind, carrying the number of lines left out; other kinds
// and other handlers have limits of their own, and info lines pass.
func TestLimitedLoggerCountsSuppressed(t *testing.T) {
	lines := newLineLogger()
	var l watermill.LoggerAdapter = limitedLogger{next: lines, kinds: &errorKinds{every: 200 * time.Millisecond, burst: 2, kinds: make(map[errorKind]*errorLimit)}}
	h1 := l.With(watermill.LogFields{"handler_name": "h1"})
	for range 5 {
		h1.Error("Handler returned error", errIndex, nil)
		l.Error("Handler returned error", errIndex, watermill.LogFields{"handler_name": "h2"})
		l.Info("fate", nil)
	}
	if got := len(lines.Lines()); got != 2+2+5 {
		t.Fatalf("%d lines, want 2 per handler and 5 info lines:\n%s", got, strings.Join(lines.Lines(), "\n"))
	}
	time.Sleep(250 * time.Millisecond)
	h1.Error("Handler returned error", errIndex, nil)
	last := lines.Lines()[len(lines.Lines())-1]
	if !strings.Contains(last, suppressedField+":3") {
		t.Errorf("the line after the interval = %q, want %s:3", last, suppressedField)
	}
}

// TestMalformedDeadLetteredWithGateOff: with retry.disabled, a payload the
// handler cannot decode is still dead-lettered at once, cause malformed,
// and what the handler returned with its error is not published; other
// failures are nacked as in plain Watermill.
func TestMalformedDeadLetteredWithGateOff(t *testing.T) {
	cfg := Config{Broker: brokerMemory}
	cfg.Retry.Disabled = true
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	if _, err := r.AddHandler("h", "in", "out", func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		_, err := cost.Decode(msg.Payload)
		return []*message.Message{message.NewMessage("output", pingPayload(1))}, err
	}); err != nil {
		t.Fatal(err)
	}
	dead := watchTopic(t, r, cfg.Retry.DeadLetterTopicFor("in"))
	outputs := watchTopic(t, r, "out")
	startRouter(t, r)
	if err := r.back.publisher().Publish("in", message.NewMessage("bad", []byte("not geometry"))); err != nil {
		t.Fatal(err)
	}
	dead.wait(t, 1, 5*time.Second)
	time.Sleep(200 * time.Millisecond)
	if got := dead.all(); len(got) != 1 || got[0].UUID != "bad" || got[0].Metadata.Get(retrygate.DeadLetterCauseKey) != "malformed" {
		t.Fatalf("dead letters %v, want bad once with cause malformed", got)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want once", n)
	}
	if o := outputs.all(); len(o) != 0 {
		t.Errorf("%d outputs of a failed handler published", len(o))
	}
}

// TestLimitedLoggerForgetsKinds: error lines whose text varies do not grow
// the logger's table without end.
func TestLimitedLoggerForgetsKinds(t *testing.T) {
	kinds := &errorKinds{every: time.Hour, burst: 1, kinds: make(map[errorKind]*errorLimit)}
	l := limitedLogger{next: watermill.NopLogger{}, kinds: kinds}
	for i := range 3 * maxErrorKinds {
		l.Error(fmt.Sprintf("failed %d", i), errIndex, nil)
	}
	if n := len(kinds.kinds); n > maxErrorKinds {
		t.Errorf("%d kinds remembered, want at most %d", n, maxErrorKinds)
	}
}
