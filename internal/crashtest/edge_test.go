package crashtest_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/crashtest"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/internal/redistest"
)

const topic = "parcels"

// square is a closed polygon ring of n ≥ 4 vertices.
func square(n int) string {
	var b strings.Builder
	b.WriteString(`{"type":"Polygon","coordinates":[[`)
	for i := 0; i < n-1; i++ {
		fmt.Fprintf(&b, "[%d,%d],", i, i%7)
	}
	b.WriteString(`[0,0]]]}`)
	return b.String()
}

// burst publishes n messages through a router built from cfg (its
// publisher stamps vertex_count): one in five is a 200-vertex polygon, the
// rest 5-vertex ones. It returns the message ids.
func burst(t *testing.T, cfg string, n int) []string {
	t.Helper()
	pub := stampingPublisher(t, cfg)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("m%05d", i)
		v := 5
		if i%5 == 0 {
			v = 200
		}
		if err := pub.Publish(topic, message.NewMessage(ids[i], []byte(square(v)))); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// account checks the journals once every id is done (or fails after
// timeout): each id finished at least once, and an id finished more than
// once only if a consumer in mayRepeat had started it. It returns the
// number of duplicates.
func account(t *testing.T, ids []string, timeout time.Duration, mayRepeat []*crashtest.Consumer, all ...*crashtest.Consumer) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var done map[string]int
	for {
		done = map[string]int{}
		for _, c := range all {
			for id, k := range c.Journal().Done {
				done[id] += k
			}
		}
		var missing []string
		for _, id := range ids {
			if done[id] == 0 {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages never processed after %s: %v", len(missing), len(ids), timeout, missing[:min(len(missing), 10)])
		}
		time.Sleep(100 * time.Millisecond)
	}
	started := map[string]bool{}
	for _, c := range mayRepeat {
		for id := range c.Journal().Started {
			started[id] = true
		}
	}
	var dups, unexplained []string
	for id, k := range done {
		if k > 1 {
			dups = append(dups, id)
			if !started[id] {
				unexplained = append(unexplained, id)
			}
		}
	}
	sort.Strings(unexplained)
	if len(unexplained) > 0 {
		t.Errorf("%d duplicates not started by a killed consumer: %v", len(unexplained), unexplained)
	}
	t.Logf("%d messages, %d duplicates (%d started by the consumers that may repeat)", len(ids), len(dups), len(started))
	return len(dups)
}

// waitDone waits until consumer c has finished at least n messages.
func waitDone(t *testing.T, c *crashtest.Consumer, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for len(c.Journal().Done) < n {
		if time.Now().After(deadline) {
			t.Fatalf("consumer %d finished %d messages, want %d", c.Pid(), len(c.Journal().Done), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// requireInFlight fails the test when the killed consumer c had no message
// started and unfinished: the kill then tested nothing.
func requireInFlight(t *testing.T, c *crashtest.Consumer) {
	t.Helper()
	j := c.Journal()
	n := 0
	for id := range j.Started {
		if j.Done[id] < j.Started[id] {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("the kill found consumer %d idle: nothing in flight to lose", c.Pid())
	}
	t.Logf("killed consumer %d with %d messages in flight", c.Pid(), n)
}

// brokers are the two brokers every crash test runs on, each with its
// config builder.
var brokers = []struct {
	name string
	cfg  func(*testing.T) string
}{{"kafka", kafkaConfig}, {"redis", redisConfig}}

// edgeBrokers adds Kafka with consumer key to brokers, for the edge tests.
var edgeBrokers = append(brokers[:len(brokers):len(brokers)], struct {
	name string
	cfg  func(*testing.T) string
}{"kafka-key", kafkaKeyConfig})

// keyWindow is kafka.window_messages with consumer key: after a kill -9,
// the partitions' next owner processes at most the span, eight times the
// window, of each partition again. Small, so that the bound (4 partitions
// of 32) is well below the burst.
const keyWindow = 4

func kafkaKeyConfig(t *testing.T) string {
	return kafkaConfig(t) + fmt.Sprintf("  consumer: key\n  window_messages: %d\n", keyWindow)
}

func kafkaConfig(t *testing.T) string {
	b := kafkatest.Start(t, 4, topic)
	return fmt.Sprintf(`broker: kafka
close_timeout: 20s
budget:
  vertices: 1000
kafka:
  brokers: [%s]
  version: 2.3.0
  consumer_group: crash
  session_timeout: 6s
  heartbeat_interval: 500ms
  rebalance_timeout: 5s
`, strings.Join(b.Brokers(), ","))
}

func redisConfig(t *testing.T) string {
	s := redistest.Start(t)
	return fmt.Sprintf(`broker: redis
close_timeout: 20s
budget:
  vertices: 1000
redis:
  addr: %s
  consumer_group: crash
  block_time: 50ms
  claim_interval: 250ms
  max_idle_time: 2s
`, s.Addr())
}

// A consumer killed with SIGKILL mid-burst: once a survivor has taken its
// partitions (Kafka) or claimed its pending entries (Redis), every message
// is processed, and the only duplicates are messages the killed process
// had started.
func TestEdgeKillConsumer(t *testing.T) {
	for _, b := range edgeBrokers {
		t.Run(b.name, func(t *testing.T) {
			cfg := b.cfg(t)
			ids := burst(t, cfg, 400)
			victim := crashtest.Start(t, crashtest.Options{Config: cfg, Topic: topic, PerVertex: 500 * time.Microsecond,
				Env: []string{"SPILLWAY_REDIS_CONSUMER=victim"}})
			survivor := crashtest.Start(t, crashtest.Options{Config: cfg, Topic: topic, PerVertex: 500 * time.Microsecond,
				Env: []string{"SPILLWAY_REDIS_CONSUMER=survivor"}})
			waitDone(t, victim, 40)
			victim.Kill()
			requireInFlight(t, victim)
			dups := account(t, ids, 90*time.Second, []*crashtest.Consumer{victim}, victim, survivor)
			// Consumer key: the survivor restarts each of the victim's
			// partitions (at most all 4) from its committed watermark.
			if b.name == "kafka-key" && dups > 4*8*keyWindow {
				t.Errorf("%d duplicates, more than the span (8 × window %d) times 4 partitions", dups, keyWindow)
			}
		})
	}
}

// A consumer killed and restarted with the same identity (Kafka group
// member of the same group; Redis consumer of the same name) and no peer:
// nothing it had pending is lost.
func TestEdgeRestartSameIdentity(t *testing.T) {
	for _, b := range edgeBrokers {
		t.Run(b.name, func(t *testing.T) {
			cfg := b.cfg(t)
			ids := burst(t, cfg, 300)
			opts := crashtest.Options{Config: cfg, Topic: topic, PerVertex: 500 * time.Microsecond,
				Env: []string{"SPILLWAY_REDIS_CONSUMER=same"}}
			first := crashtest.Start(t, opts)
			waitDone(t, first, 40)
			first.Kill()
			requireInFlight(t, first)
			opts.Journal = first.JournalPath() + ".2"
			second := crashtest.Start(t, opts)
			account(t, ids, 90*time.Second, []*crashtest.Consumer{first}, first, second)
		})
	}
}

// A consumer stopped with SIGTERM mid-burst shuts down gracefully: the
// work it had admitted finishes and is acknowledged before its
// subscriptions close, what waited for budget goes back to the broker, and
// no message is processed twice (issue 13, item 4).
func TestEdgeSigtermNoDuplicates(t *testing.T) {
	for _, b := range edgeBrokers {
		t.Run(b.name, func(t *testing.T) {
			cfg := b.cfg(t)
			ids := burst(t, cfg, 400)
			// Each handler publishes a message, which Watermill does after
			// the handler (and the budget) returned and before the ack.
			stopped := crashtest.Start(t, crashtest.Options{Config: cfg, Topic: topic, PerVertex: 500 * time.Microsecond,
				Output: topic + ".out", Env: []string{"SPILLWAY_REDIS_CONSUMER=stopped"}})
			peer := crashtest.Start(t, crashtest.Options{Config: cfg, Topic: topic, PerVertex: 500 * time.Microsecond,
				Output: topic + ".out", Env: []string{"SPILLWAY_REDIS_CONSUMER=peer"}})
			waitDone(t, stopped, 40)
			if err := stopped.Terminate(30 * time.Second); err != nil {
				t.Fatal(err)
			}
			if dups := account(t, ids, 90*time.Second, nil, stopped, peer); dups != 0 {
				t.Errorf("%d duplicates after a graceful stop, want 0", dups)
			}
		})
	}
}
