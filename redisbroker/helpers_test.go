package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

func TestMain(m *testing.M) {
	ignore := []goleak.Option{
		// Watermill's universal suite fans several subscribers into one
		// channel with an internal helper whose goroutines block forever
		// once the test stops reading (they do not watch Close). They belong
		// to the suite, not to this package.
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/internal/subscriber.(*multiplier).Subscribe.func2"),
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/internal/subscriber.(*multiplier).Subscribe.func3"),
	}
	code := m.Run()
	if code == 0 {
		// watermill-redisstream's stream reader sleeps 500 ms after a read
		// fails (as it does once Close closes the client) before it sees
		// Close, longer than goleak's own retries wait: give it two
		// seconds, then report what is still running.
		var err error
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if err = goleak.Find(ignore...); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "goleak: errors on a successful run:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var idSeq atomic.Int64

// uniq returns a name unique in this test binary run.
func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), idSeq.Add(1))
}

// testConfig is a configuration with short timings for srv: a new group and
// consumer base name per call.
func testConfig(srv *redistest.Server) redisbroker.Config {
	return redisbroker.Config{
		Addr:          srv.Addr(),
		ConsumerGroup: uniq("g"),
		Consumer:      uniq("c"),
		Consumers:     2,
		BlockTime:     50 * time.Millisecond,
		ClaimInterval: 250 * time.Millisecond,
		MaxIdleTime:   5 * time.Second,
	}
}

func newPublisher(t testing.TB, cfg redisbroker.Config) message.Publisher {
	t.Helper()
	p, err := redisbroker.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func newSubscriber(t testing.TB, cfg redisbroker.Config) *redisbroker.Subscriber {
	t.Helper()
	s, err := redisbroker.NewSubscriber(cfg, redisbroker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func rawClient(t testing.TB, srv *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// subscribe subscribes sub to topic until the test ends (or testCtx's
// minute is up).
func subscribe(t testing.TB, sub message.Subscriber, topic string) <-chan *message.Message {
	t.Helper()
	msgs, err := sub.Subscribe(testCtx(t), topic)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// receive returns the next message from msgs, failing the test if none
// comes within 15 seconds or the subscription ends first.
func receive(t testing.TB, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-msgs:
		if !ok {
			t.Fatal("the subscription ended before a message came")
		}
		return msg
	case <-time.After(15 * time.Second):
		t.Fatal("no message within 15 s")
	}
	return nil
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// testLogger logs errors only (to the test log) unless -v is set and
// SPILLWAY_REDIS_DEBUG=1.
func testLogger(t testing.TB) watermill.LoggerAdapter {
	if os.Getenv("SPILLWAY_REDIS_DEBUG") == "1" {
		return watermill.NewStdLogger(true, false)
	}
	return errorLogger{t: t}
}

type errorLogger struct {
	watermill.NopLogger
	t testing.TB
}

func (l errorLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.t.Logf("ERROR %s: %v %v", msg, err, fields)
}

func (l errorLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func publish(t testing.TB, pub message.Publisher, topic string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := pub.Publish(topic, message.NewMessage(id, []byte("payload-"+id))); err != nil {
			t.Fatal(err)
		}
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// runRouter runs a Watermill router with one handler on topic behind mws
// (outermost first) until the test ends.
func runRouter(t testing.TB, sub message.Subscriber, topic string, h message.NoPublishHandlerFunc, mws ...message.HandlerMiddleware) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(mws...)
	r.AddConsumerHandler("h-"+topic, topic, sub, h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-r.Running():
	case <-time.After(30 * time.Second):
		t.Fatal("router did not start")
	}
	t.Cleanup(func() {
		_ = r.Close()
		<-done
	})
	return r
}

// counter records how often each message UUID was handled.
type counter struct {
	mu   sync.Mutex
	seen map[string]int
}

func newCounter() *counter { return &counter{seen: make(map[string]int)} }

func (c *counter) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[id]++
	return c.seen[id]
}

func (c *counter) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.seen {
		n += v
	}
	return n
}

func (c *counter) missing(want []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, id := range want {
		if c.seen[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes. Deadlines are
// generous: the machine is shared with other test runs.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pendingOf returns the XPENDING summary entry for one ID.
func pendingOf(t testing.TB, c *redis.Client, stream, group, id string) (redis.XPendingExt, bool) {
	t.Helper()
	p, err := c.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: group, Start: id, End: id, Count: 1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(p) == 0 {
		return redis.XPendingExt{}, false
	}
	return p[0], true
}

var errNacked = errors.New("nacked by the test")
