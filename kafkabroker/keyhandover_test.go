package kafkabroker_test

import (
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
