package kafkabroker_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// clusterOn opens a Cluster in consumer key on broker, with client id
// clientID (the group orders its members by it: with one partition, the
// member whose id sorts first owns it) and a window of window records.
func clusterOn(t *testing.T, broker *kafkatest.Broker, clientID string, window int) *kafkabroker.Cluster {
	t.Helper()
	cl, err := kafkabroker.New(kafkabroker.Config{
		Brokers:           broker.Brokers(),
		Version:           "2.3.0", // kfake's limit
		Partitions:        1,
		CreateTopics:      true,
		ClientID:          clientID,
		Consumer:          kafkabroker.ConsumerKey,
		WindowMessages:    window,
		HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  4 * time.Second,
		NackResendSleep:   5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// TestKeyHandoverKeepsInheritedCompleted: a rolling deploy that shrinks
// the window. The first member (window 128) completes every record but
// offset 0, which it still holds when a second member (window 2) joins and
// takes the partition; the commit's metadata lists the 119 records
// completed beyond the watermark. The second member holds offset 0 too and
// reads only as far as its smaller span allows before the first member
// leaves and the group rebalances again. Its commit must still list every
// record the first member completed, not only the ones it read: when it
// owns the partition again, it processes offset 0 and nothing else twice.
func TestKeyHandoverKeepsInheritedCompleted(t *testing.T) {
	leakCheck(t)
	const (
		topic = "handover"
		n     = 120
	)
	broker := kafkatest.Start(t, 1)
	large := clusterOn(t, broker, "z-large", 128)
	small := clusterOn(t, broker, "a-small", 2)
	publishKeyed(t, large, topic, n, n, nil) // one key each; record 0 is "0"

	var (
		mu        sync.Mutex
		completed = map[string]int{}
		phase     atomic.Int32 // 0: the first member holds "0"; 1: the second; 2: it completes
		trs       [2]atomic.Pointer[kafkabroker.SessionTracker]
		holding   atomic.Int32 // the phase whose holder has "0" in hand, -1 none
	)
	holding.Store(-1)
	handler := func(i int) func(*message.Message) bool {
		return func(msg *message.Message) bool {
			if msg.UUID == "0" {
				if p := phase.Load(); p < 2 {
					tr := trs[i].Load()
					for tr == nil {
						time.Sleep(time.Millisecond)
						tr = trs[i].Load()
					}
					holding.Store(p)
					<-tr.Revoked(msg) // never completes in this session
					return false
				}
			}
			mu.Lock()
			completed[msg.UUID]++
			mu.Unlock()
			return true
		}
	}
	done := func() int { mu.Lock(); defer mu.Unlock(); return len(completed) }

	first := join(t, large, "g", topic, handler(0))
	trs[0].Store(first.tr)
	waitFor(t, 30*time.Second, func() bool { return done() == n-1 && holding.Load() == 0 }, "the first member to complete all but offset 0")

	phase.Store(1)
	second := join(t, small, "g", topic, handler(1))
	trs[1].Store(second.tr)
	waitFor(t, 30*time.Second, func() bool { return holding.Load() == 1 }, "the second member to hold offset 0")
	// Let it read what its span allows (skipping what the first member
	// completed), then the first member leaves: the group rebalances.
	time.Sleep(500 * time.Millisecond)
	phase.Store(2)
	first.leave(t)
	waitFor(t, 30*time.Second, func() bool { return done() == n }, "offset 0 to complete")
	time.Sleep(time.Second) // a duplicate, if any, shows up now
	second.leave(t)

	mu.Lock()
	defer mu.Unlock()
	var dups []string
	for id, k := range completed {
		if k > 1 {
			dups = append(dups, id)
		}
	}
	if len(completed) != n || len(dups) != 0 {
		t.Errorf("%d of %d messages completed, %d of them more than once: %v", len(completed), n, len(dups), dups)
	}
}

// TestKeySteppedAsideIsNotRedelivered: after a rebalance, a record counts
// as a redelivery (SessionTracker.Redelivered, which the retry gate defers
// under pressure) only if a handler failed it in an earlier session. A
// record handed over that stepped aside when its session ended (acked
// without running, as a message waiting for budget does), and the records
// that waited behind their keys, never ran: they are fresh work, even
// though records at higher offsets were handed over.
func TestKeySteppedAsideIsNotRedelivered(t *testing.T) {
	leakCheck(t)
	const topic = "stepped-aside"
	cl := keyCluster(t, 1, func(c *kafkabroker.Config) { c.WindowMessages = 8 })
	if err := cl.EnsureTopic(topic); err != nil {
		t.Fatal(err)
	}
	pub, err := cl.NewPublisher()
	if err != nil {
		t.Fatal(err)
	}
	// Offset: key. 0 fails when revoked; 1 steps aside; 2 and 4 wait
	// behind them; 3 completes.
	for i, key := range []string{"fails", "steps-aside", "fails", "completes", "steps-aside"} {
		m := message.NewMessage(strconv.Itoa(i), nil)
		m.Metadata.Set("entity_id", key)
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
	}
	_ = pub.Close()

	var (
		rebalanced atomic.Bool
		holding    atomic.Int32 // offsets 0 and 1 held in the first session
		completed  atomic.Int32
		mu         sync.Mutex
		redeliv    = map[int64]bool{}
	)
	handle := func(tr *kafkabroker.SessionTracker, msg *message.Message) {
		tr.Begin(msg)
		off, _ := kafkabroker.OffsetFromCtx(msg.Context())
		if rebalanced.Load() {
			mu.Lock()
			redeliv[off] = tr.Redelivered(msg)
			mu.Unlock()
			tr.Completed(msg)
			msg.Ack()
			return
		}
		switch off {
		case 0:
			holding.Add(1)
			<-tr.Revoked(msg)
			msg.Nack() // it ran and failed
		case 1:
			holding.Add(1)
			<-tr.Revoked(msg)
			msg.Ack() // stepped aside: never ran, not completed
		default:
			tr.Completed(msg)
			msg.Ack()
			completed.Add(1)
		}
	}
	subscribe := func() (message.Subscriber, chan struct{}) {
		sub, tr, err := cl.NewSubscriber("g")
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := sub.Subscribe(context.Background(), topic)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		var wg sync.WaitGroup
		go func() {
			defer close(done)
			for msg := range msgs {
				wg.Add(1)
				go func() { defer wg.Done(); handle(tr, msg) }()
			}
			wg.Wait()
		}()
		return sub, done
	}
	a, aDone := subscribe()
	waitFor(t, 20*time.Second, func() bool { return holding.Load() == 2 && completed.Load() == 1 }, "offsets 0 and 1 held, 3 completed")
	rebalanced.Store(true)
	b, bDone := subscribe()
	waitFor(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(redeliv) == 4 }, "offsets 0, 1, 2 and 4 after the rebalance")
	for _, s := range []message.Subscriber{b, a} {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}
	<-aDone
	<-bDone

	mu.Lock()
	defer mu.Unlock()
	for _, off := range []int64{0, 1, 2, 4} {
		if want := off == 0; redeliv[off] != want {
			t.Errorf("offset %d: Redelivered %v after the rebalance, want %v (only offset 0 ran, and failed)", off, redeliv[off], want)
		}
	}
	if _, ok := redeliv[3]; ok {
		t.Error("offset 3, completed before the rebalance, was handed over again")
	}
}
