package kafkabroker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/telemetry/kafkatel"
)

// leakCheck fails t if, when it ends, goroutines run that did not run
// when it started. go-metrics runs one process-wide ticker for Sarama's
// meters, started on first use and never stopped; not per client.
// Watermill's universal suite leaves some subscriptions of its own open,
// which the snapshot at the start leaves out.
func leakCheck(t *testing.T) {
	opts := []goleak.Option{
		goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
		// Sarama finishes a metadata refresh that was in flight when its
		// client closed (retrying against a broker the test stopped), then the
		// goroutine ends by itself.
		goleak.IgnoreAnyFunction("github.com/IBM/sarama.(*currentRefresh).start.func1"),
		goleak.IgnoreAnyFunction("os/exec.(*Cmd).Start.func2"),
		goleak.IgnoreCurrent(),
	}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// keyCluster opens a Cluster in consumer key on a fresh broker.
func keyCluster(t *testing.T, partitions int32, mutate func(*kafkabroker.Config), opts ...kafkabroker.Option) *kafkabroker.Cluster {
	t.Helper()
	broker := kafkatest.Start(t, partitions)
	cfg := kafkabroker.Config{
		Brokers:           broker.Brokers(),
		Version:           "2.3.0", // kfake's limit
		Partitions:        partitions,
		CreateTopics:      true,
		Consumer:          kafkabroker.ConsumerKey,
		HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  4 * time.Second,
		NackResendSleep:   5 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	cl, err := kafkabroker.New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// publishKeyed publishes n messages over keys keys: message i has key
// "k<i%keys>" and, in metadata, its sequence number within its key.
func publishKeyed(t *testing.T, cl *kafkabroker.Cluster, topic string, n, keys int, payload func(i int) []byte) {
	t.Helper()
	if err := cl.EnsureTopic(topic); err != nil {
		t.Fatal(err)
	}
	pub, err := cl.NewPublisher()
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	batch := make([]*message.Message, 0, 200)
	for i := range n {
		var body []byte
		if payload != nil {
			body = payload(i)
		}
		m := message.NewMessage(strconv.Itoa(i), body)
		m.Metadata.Set("entity_id", "k"+strconv.Itoa(i%keys))
		m.Metadata.Set("seq", strconv.Itoa(i/keys))
		batch = append(batch, m)
		if len(batch) == cap(batch) || i == n-1 {
			if err := pub.Publish(topic, batch...); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// member is one consumer of the group: it handles every message on a
// goroutine of its own, as Watermill's router does, telling its tracker
// when a handler succeeded, as the router's stack does.
type member struct {
	sub     message.Subscriber
	tr      *kafkabroker.SessionTracker
	leaving atomic.Bool
	wg      sync.WaitGroup
	done    chan struct{}
}

func join(t *testing.T, cl *kafkabroker.Cluster, group, topic string, handle func(*message.Message) bool) *member {
	t.Helper()
	sub, tr, err := cl.NewSubscriber(group)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	m := &member{sub: sub, tr: tr, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for msg := range msgs {
			if m.leaving.Load() {
				continue // never started: the next owner gets it
			}
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				tr.Begin(msg)
				if handle(msg) {
					tr.Completed(msg)
					msg.Ack()
				} else {
					msg.Nack()
				}
			}()
		}
	}()
	return m
}

// leave finishes the handlers already started, then closes the subscriber.
func (m *member) leave(t *testing.T) {
	m.leaving.Store(true)
	m.wg.Wait()
	if err := m.sub.Close(); err != nil {
		t.Error(err)
	}
	<-m.done
	m.wg.Wait()
}

// TestKeyOrder: thousands of keys, mixed cost, nacks, a second member
// joining mid-stream and the first one leaving: for every key the handler
// saw its messages one at a time, in offset order, each once.
func TestKeyOrder(t *testing.T) {
	leakCheck(t)
	const (
		topic = "order"
		n     = 6000
		keys  = 2000
	)
	cl := keyCluster(t, 4, func(c *kafkabroker.Config) { c.WindowMessages = 64 })
	publishKeyed(t, cl, topic, n, keys, nil)

	var (
		mu        sync.Mutex
		processed = map[string][]int{}
		inFlight  = map[string]int{}
		attempts  = map[string]int{}
		total     atomic.Int64
		overlap   atomic.Int64
		nacks     atomic.Int64
	)
	handle := func(msg *message.Message) bool {
		key := msg.Metadata.Get("entity_id")
		seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
		id := key + "/" + strconv.Itoa(seq)
		mu.Lock()
		inFlight[key]++
		if inFlight[key] > 1 {
			overlap.Add(1)
		}
		attempts[id]++
		first := attempts[id] == 1
		mu.Unlock()
		// Mixed cost: mostly cheap, some heavy.
		switch r := rand.IntN(100); {
		case r < 5:
			time.Sleep(time.Duration(5+rand.IntN(15)) * time.Millisecond)
		case r < 50:
			time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		}
		ok := !(first && rand.IntN(100) < 3)
		mu.Lock()
		inFlight[key]--
		if ok {
			processed[key] = append(processed[key], seq)
		}
		mu.Unlock()
		if ok {
			total.Add(1)
		} else {
			nacks.Add(1)
		}
		return ok
	}
	a := join(t, cl, "g", topic, handle)
	waitFor(t, 60*time.Second, func() bool { return total.Load() >= n/4 }, "a quarter processed")
	b := join(t, cl, "g", topic, handle)
	waitFor(t, 60*time.Second, func() bool { return total.Load() >= n*2/3 }, "two thirds processed")
	a.leave(t)
	waitFor(t, 60*time.Second, func() bool { return total.Load() >= n }, "everything processed")
	time.Sleep(500 * time.Millisecond) // duplicates, if any, show up
	b.leave(t)

	if overlap.Load() != 0 {
		t.Errorf("%d times two messages of one key were in flight together", overlap.Load())
	}
	if nacks.Load() == 0 {
		t.Error("no nack: the test did not exercise redelivery")
	}
	mu.Lock()
	defer mu.Unlock()
	bad := 0
	for k := range keys {
		key := "k" + strconv.Itoa(k)
		got := processed[key]
		want := n / keys
		ok := len(got) == want
		for i := 0; ok && i < want; i++ {
			ok = got[i] == i
		}
		if !ok {
			bad++
			if bad <= 5 {
				t.Errorf("key %s processed %v, want 0..%d in order, once each", key, got, want-1)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d keys out of order, incomplete or duplicated", bad, keys)
	}
	t.Logf("%d processed, %d nacks, late marks a %d b %d, evictions a %d b %d",
		total.Load(), nacks.Load(), a.tr.LateMarks(), b.tr.LateMarks(), a.tr.Evictions(), b.tr.Evictions())
}

func waitFor(t *testing.T, d time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lag is the group's total lag on topic.
func lag(t *testing.T, cl *kafkabroker.Cluster, group, topic string) int64 {
	t.Helper()
	client, err := cl.Client()
	if err != nil {
		t.Fatal(err)
	}
	src, err := kafkatel.NewLagSource(client, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	samples, err := src(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, s := range samples {
		total += s.Lag
	}
	return total
}

// TestKeyWatermark: a slow message at offset k holds the commit at k
// while the ones after it complete; when its owner leaves before it
// completes, the next owner receives k alone (the ones after it completed
// and the commit's metadata says so), nothing before.
func TestKeyWatermark(t *testing.T) {
	leakCheck(t)
	const topic = "watermark"
	cl := keyCluster(t, 1, nil)
	publishKeyed(t, cl, topic, 10, 10, nil)

	release := make(chan struct{})
	var done atomic.Int64
	a := join(t, cl, "g", topic, func(msg *message.Message) bool {
		if off, _ := kafkabroker.OffsetFromCtx(msg.Context()); off == 3 {
			<-release
			return false // never completes here
		}
		done.Add(1)
		return true
	})
	waitFor(t, 20*time.Second, func() bool { return done.Load() == 9 }, "the nine fast messages")
	// The commit stays at 3: seven messages of lag, however long we wait.
	waitFor(t, 10*time.Second, func() bool { return lag(t, cl, "g", topic) == 7 }, "the commit at offset 3")
	time.Sleep(1500 * time.Millisecond) // past Sarama's auto-commit interval
	if l := lag(t, cl, "g", topic); l != 7 {
		t.Errorf("lag %d with offset 3 unfinished, want 7", l)
	}
	a.leaving.Store(true)
	close(release)
	a.leave(t)

	var (
		mu   sync.Mutex
		got  []int64
		recv atomic.Int64
	)
	b := join(t, cl, "g", topic, func(msg *message.Message) bool {
		off, _ := kafkabroker.OffsetFromCtx(msg.Context())
		mu.Lock()
		got = append(got, off)
		mu.Unlock()
		recv.Add(1)
		return true
	})
	waitFor(t, 20*time.Second, func() bool { return recv.Load() >= 1 }, "the redelivery of offset 3")
	time.Sleep(time.Second)
	b.leave(t)
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(got) != "[3]" {
		t.Errorf("next owner received offsets %v, want [3]", got)
	}
	if l := lag(t, cl, "g", topic); l != 0 {
		t.Errorf("lag %d after the redelivery, want 0", l)
	}
}

// TestKeyWindow: the window bounds the records handed over and not yet
// committed, in messages and in bytes; a record larger than the byte
// window is admitted alone.
func TestKeyWindow(t *testing.T) {
	leakCheck(t)
	cases := []struct {
		name    string
		msgs    int
		bytes   int
		payload func(i int) []byte
		want    int // handed over while nothing is acked
	}{
		{"messages", 8, 0, nil, 8},
		{"bytes", 0, 10 << 10, func(int) []byte { return make([]byte, 4<<10) }, 2},
		{"oversized", 0, 10 << 10, func(int) []byte { return make([]byte, 64<<10) }, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			cl := keyCluster(t, 1, func(c *kafkabroker.Config) {
				c.WindowMessages, c.WindowBytes = tc.msgs, tc.bytes
			})
			publishKeyed(t, cl, "w", 30, 30, tc.payload)
			release := make(chan struct{})
			var recv atomic.Int64
			m := join(t, cl, "g", "w", func(*message.Message) bool {
				recv.Add(1)
				<-release
				return true
			})
			waitFor(t, 20*time.Second, func() bool { return recv.Load() >= int64(tc.want) }, "the window")
			time.Sleep(time.Second)
			if got := recv.Load(); got != int64(tc.want) {
				t.Errorf("%d handed over with nothing acked, want %d", got, tc.want)
			}
			close(release)
			waitFor(t, 30*time.Second, func() bool { return recv.Load() == 30 }, "all 30 after the release")
			m.leave(t)
		})
	}
}

// TestKeySpan: records that finish behind a slow one leave the window, so
// the slow one does not hold the window's records; but at most eight times
// the window is read and not yet committed, so reading stops there until
// the slow one completes.
func TestKeySpan(t *testing.T) {
	leakCheck(t)
	const (
		topic  = "span"
		window = 4
		span   = 8 * window
		n      = 100
	)
	cl := keyCluster(t, 1, func(c *kafkabroker.Config) { c.WindowMessages = window })
	publishKeyed(t, cl, topic, n, n, func(int) []byte { return make([]byte, 100) })
	release := make(chan struct{})
	var recv, done atomic.Int64
	m := join(t, cl, "g", topic, func(msg *message.Message) bool {
		recv.Add(1)
		if off, _ := kafkabroker.OffsetFromCtx(msg.Context()); off == 0 {
			<-release
		}
		done.Add(1)
		return true
	})
	waitFor(t, 20*time.Second, func() bool { return done.Load() >= span-1 }, "the span behind the slow record")
	time.Sleep(time.Second)
	if got := recv.Load(); got != span {
		t.Errorf("%d handed over while offset 0 is unfinished, want the span, %d (window %d)", got, span, window)
	}
	// Only offset 0 is unfinished: the window holds it alone (its payload
	// and its metadata headers).
	if recs, bytes := m.tr.Window(); recs != 1 || bytes < 100 || bytes > 1000 {
		t.Errorf("window %d records, %d bytes with only offset 0 unfinished, want 1 record of 100 to 1000 bytes", recs, bytes)
	}
	if l := lag(t, cl, "g", topic); l != n {
		t.Errorf("lag %d with offset 0 unfinished, want %d", l, n)
	}
	close(release)
	waitFor(t, 30*time.Second, func() bool { return done.Load() == n }, "all after the release")
	waitFor(t, 10*time.Second, func() bool { return lag(t, cl, "g", topic) == 0 }, "the commit of everything")
	if recs, bytes := m.tr.Window(); recs != 0 || bytes != 0 {
		t.Errorf("window %d records, %d bytes once everything is done, want 0", recs, bytes)
	}
	m.leave(t)
}

// TestKeyPartitionWindows: the window's fill is reported per partition,
// and Window is their sum; so is the read-ahead's.
func TestKeyPartitionWindows(t *testing.T) {
	leakCheck(t)
	const (
		topic  = "perpart"
		window = 8
	)
	cl := keyCluster(t, 4, func(c *kafkabroker.Config) { c.WindowMessages = window })
	publishKeyed(t, cl, topic, 400, 400, func(int) []byte { return make([]byte, 10) })
	release := make(chan struct{})
	var recv atomic.Int64
	m := join(t, cl, "g", topic, func(*message.Message) bool {
		recv.Add(1)
		<-release
		return true
	})
	waitFor(t, 20*time.Second, func() bool { return recv.Load() >= 4*window }, "every partition's window")
	type fill struct {
		topic     string
		partition int32
		records   int64
	}
	var got []fill
	var sumBytes int64
	m.tr.PartitionWindows(func(topic string, partition int32, records, bytes int64) {
		got = append(got, fill{topic, partition, records})
		sumBytes += bytes
	})
	want := []fill{{topic, 0, window}, {topic, 1, window}, {topic, 2, window}, {topic, 3, window}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("PartitionWindows reported %v, want %v", got, want)
	}
	if recs, bytes := m.tr.Window(); recs != 4*window || bytes != sumBytes || bytes == 0 {
		t.Errorf("Window() = %d records, %d bytes; the partitions sum to %d records, %d bytes", recs, bytes, 4*window, sumBytes)
	}
	// Every record not in a window waits in its partition's read-ahead
	// (at most 32 x 8 records), once fetched: 400 - 4 x 8 in all.
	var ahead []fill
	waitFor(t, 20*time.Second, func() bool {
		ahead = ahead[:0]
		var sum int64
		m.tr.PartitionReadAheads(func(topic string, partition int32, records, bytes int64) {
			if bytes < 10*records || records > 32*window {
				t.Errorf("read-ahead of partition %d: %d records in %d bytes", partition, records, bytes)
			}
			ahead = append(ahead, fill{topic, partition, records})
			sum += records
		})
		return len(ahead) == 4 && sum == 400-4*window
	}, "every record not in a window in a read-ahead")
	t.Logf("read-aheads: %v", ahead)
	close(release)
	waitFor(t, 30*time.Second, func() bool { return recv.Load() == 400 }, "all after the release")
	m.leave(t)
	n := 0
	m.tr.PartitionWindows(func(string, int32, int64, int64) { n++ })
	m.tr.PartitionReadAheads(func(string, int32, int64, int64) { n++ })
	if n != 0 {
		t.Errorf("%d partitions reported after the member left, want none", n)
	}
}

// TestKeyReadIsNotRedelivered: after a rebalance, only the records a
// handler failed in an earlier session count as redeliveries
// (SessionTracker.Redelivered, which the retry gate defers under
// pressure), not the ones merely read into the window behind them
// (TestKeySteppedAsideIsNotRedelivered: nor one that stepped aside).
func TestKeyReadIsNotRedelivered(t *testing.T) {
	leakCheck(t)
	const (
		topic = "redelivered"
		n     = 10
	)
	cl := keyCluster(t, 2, func(c *kafkabroker.Config) { c.WindowMessages = 8 })
	publishKeyed(t, cl, topic, n, 1, nil) // one key: offset 0 first, the rest behind it

	var (
		rebalanced atomic.Bool
		holding    atomic.Bool // the first session's handler holds offset 0
		mu         sync.Mutex
		redeliv    = map[int64]bool{}
		trs        [2]atomic.Pointer[kafkabroker.SessionTracker]
	)
	handler := func(i int) func(*message.Message) bool {
		return func(msg *message.Message) bool {
			tr := trs[i].Load()
			if !rebalanced.Load() {
				// The first session: hold offset 0 until the rebalance
				// revokes it, with the rest of the key read behind it.
				holding.Store(true)
				for tr == nil {
					time.Sleep(time.Millisecond)
					tr = trs[i].Load()
				}
				<-tr.Revoked(msg)
				return false
			}
			off, _ := kafkabroker.OffsetFromCtx(msg.Context())
			mu.Lock()
			redeliv[off] = tr.Redelivered(msg)
			mu.Unlock()
			return true
		}
	}
	a := join(t, cl, "g", topic, handler(0))
	trs[0].Store(a.tr)
	// The handler must be holding offset 0 before the rebalance is
	// flagged: a handler goroutine that started late (a loaded machine)
	// would otherwise take the first session's delivery for the second's.
	waitFor(t, 20*time.Second, func() bool { recs, _ := a.tr.Window(); return recs >= 8 && holding.Load() }, "the window behind offset 0, held")
	rebalanced.Store(true)
	b := join(t, cl, "g", topic, handler(1))
	trs[1].Store(b.tr)
	waitFor(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(redeliv) == n }, "every offset after the rebalance")
	b.leave(t)
	a.leave(t)

	mu.Lock()
	defer mu.Unlock()
	for off := range int64(n) {
		if want := off == 0; redeliv[off] != want {
			t.Errorf("offset %d: Redelivered %v after the rebalance, want %v (only offset 0 was handed over, and failed)", off, redeliv[off], want)
		}
	}
}

// TestKeyLargeRecordPrompt: a record larger than fetch_default_bytes at the
// head of its partition arrives while the other partitions are still
// draining, not after them.
func TestKeyLargeRecordPrompt(t *testing.T) {
	leakCheck(t)
	const (
		topic = "large"
		small = 3000
	)
	cl := keyCluster(t, 4, nil) // fetch_default_bytes: 256 KiB
	if err := cl.EnsureTopic(topic); err != nil {
		t.Fatal(err)
	}
	pub, err := cl.NewPublisher()
	if err != nil {
		t.Fatal(err)
	}
	big := message.NewMessage("big", make([]byte, 400<<10))
	big.Metadata.Set("entity_id", "big")
	if err := pub.Publish(topic, big); err != nil {
		t.Fatal(err)
	}
	_ = pub.Close()
	publishKeyed(t, cl, topic, small, 500, func(int) []byte { return make([]byte, 1<<10) })

	var (
		handled  atomic.Int64
		bigAfter atomic.Int64
	)
	bigAfter.Store(-1)
	slots := make(chan struct{}, 8)
	m := join(t, cl, "g", topic, func(msg *message.Message) bool {
		if msg.UUID == "big" {
			bigAfter.Store(handled.Load())
			return true
		}
		slots <- struct{}{}
		time.Sleep(2 * time.Millisecond)
		<-slots
		handled.Add(1)
		return true
	})
	waitFor(t, 60*time.Second, func() bool { return handled.Load() == small && bigAfter.Load() >= 0 }, "every message")
	m.leave(t)
	if n := bigAfter.Load(); n > small/4 {
		t.Errorf("the large record arrived after %d of %d small ones", n, small)
	}
	t.Logf("the large record arrived after %d of %d small ones", bigAfter.Load(), small)
}

// TestKeyCommitNotBehindFetch: the watermark is committed on a connection
// the consumer does not fetch on. A broker answers one connection's
// requests in order, and a caught-up consumer's fetch waits at the broker
// for up to MaxWaitTime (3 s here): a commit sent behind it on the same
// connection lands only when the fetch returns.
func TestKeyCommitNotBehindFetch(t *testing.T) {
	leakCheck(t)
	const (
		topic   = "commit-connection"
		maxWait = 3 * time.Second
	)
	cl := keyCluster(t, 1, nil, kafkabroker.WithSaramaConfig(func(c *sarama.Config) error {
		c.Consumer.MaxWaitTime = maxWait
		return nil
	}))
	publishKeyed(t, cl, topic, 5, 5, nil)
	var done atomic.Int64
	m := join(t, cl, "g", topic, func(*message.Message) bool {
		done.Add(1)
		return true
	})
	waitFor(t, 20*time.Second, func() bool { return done.Load() == 5 }, "the five messages")
	start := time.Now()
	waitFor(t, 10*time.Second, func() bool { return lag(t, cl, "g", topic) == 0 }, "the commit")
	took := time.Since(start)
	m.leave(t)
	if took > maxWait/2 {
		t.Errorf("the watermark was committed %v after the last message was handled: behind the parked fetch", took.Round(time.Millisecond))
	}
	t.Logf("committed %v after the last message was handled", took.Round(time.Millisecond))
}

// TestKeyMessageContextEndsAfterAck: a key-mode message's context lasts
// while its handler runs and ends once the message is acked, as
// watermill-kafka's does, whether the handler asked for its Done channel
// before the ack, only after it, or derived a context from it.
func TestKeyMessageContextEndsAfterAck(t *testing.T) {
	leakCheck(t)
	const topic = "ctx-life"
	cl := keyCluster(t, 1, nil)
	publishKeyed(t, cl, topic, 3, 3, nil)

	type seen struct {
		ctx     context.Context
		done    <-chan struct{} // asked for before the ack, or nil
		derived <-chan struct{} // Done of a context derived before the ack, or nil
		live    error           // Err while the handler ran
	}
	var (
		mu  sync.Mutex
		all []seen
	)
	m := join(t, cl, "g", topic, func(msg *message.Message) bool {
		ctx := msg.Context()
		s := seen{ctx: ctx, live: ctx.Err()}
		switch off, _ := kafkabroker.OffsetFromCtx(ctx); off {
		case 0:
			s.done = ctx.Done()
		case 1:
			derived, cancel := context.WithCancel(ctx)
			t.Cleanup(cancel)
			s.derived = derived.Done()
		}
		mu.Lock()
		all = append(all, s)
		mu.Unlock()
		return true
	})
	defer m.leave(t)
	waitFor(t, 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(all) == 3 }, "the three messages")
	mu.Lock()
	defer mu.Unlock()
	for i, s := range all {
		if s.live != nil {
			t.Errorf("message %d: context ended while its handler ran: %v", i, s.live)
		}
		for _, c := range []struct {
			name string
			done <-chan struct{}
		}{{"Done asked before the ack", s.done}, {"Done asked after the ack", s.ctx.Done()}, {"a derived context", s.derived}} {
			if c.done == nil {
				continue
			}
			select {
			case <-c.done:
			case <-time.After(10 * time.Second):
				t.Errorf("message %d: %s: the context did not end after the ack", i, c.name)
			}
		}
		if s.ctx.Err() == nil {
			t.Errorf("message %d: Err nil after the ack", i)
		}
	}
}

// TestKeyAckedBeforeCloseCounts: messages acked right before the
// subscriber closes count as done, however the closing and the acks race:
// they are committed, and the next member of the group receives none of
// them. (The delivery goroutine used to pick at random between the ack and
// the subscription's end when both were ready, and abandon finished work.)
func TestKeyAckedBeforeCloseCounts(t *testing.T) {
	leakCheck(t)
	const (
		topic = "acked-close"
		n     = 48
	)
	cl := keyCluster(t, 1, func(c *kafkabroker.Config) { c.WindowMessages = 64 })
	publishKeyed(t, cl, topic, n, n, nil)
	for round := range 3 {
		sub, tr, err := cl.NewSubscriber("g")
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := sub.Subscribe(context.Background(), topic)
		if err != nil {
			t.Fatal(err)
		}
		var held []*message.Message
		timeout := time.After(20 * time.Second)
		for len(held) < n && round == 0 {
			select {
			case msg := <-msgs:
				tr.Begin(msg)
				held = append(held, msg)
			case <-timeout:
				t.Fatalf("received %d of %d distinct keys", len(held), n)
			}
		}
		if round > 0 {
			// Later members: anything they receive was redone.
			select {
			case msg := <-msgs:
				off, _ := kafkabroker.OffsetFromCtx(msg.Context())
				_ = sub.Close()
				t.Fatalf("round %d: offset %d delivered again after it was acked", round, off)
			case <-time.After(2 * time.Second):
			}
		}
		// As the router does: the work completed, then the ack.
		for _, msg := range held {
			tr.Completed(msg)
			msg.Ack()
		}
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
		for range msgs {
		}
	}
	if l := lag(t, cl, "g", topic); l != 0 {
		t.Errorf("lag %d after every message was acked, want 0", l)
	}
}
