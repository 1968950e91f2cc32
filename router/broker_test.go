package router

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/spillway-go/spillway/kafkabroker"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/middleware"
)

// leakOptions are the goroutines allowed to outlive a router.
//
// Sarama registers go-metrics meters, and go-metrics runs one process-wide
// ticker goroutine for all meters, started on first use and never stopped.
// It is not per client, so it is not a leak of ours.
//
// A redis-server started by internal/redistest is waited for, and its
// output copied, by goroutines that end when the test's cleanup stops the
// server, which runs after the deferred leak check. The router itself
// starts no processes.
var leakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
	goleak.IgnoreAnyFunction("github.com/spillway-go/spillway/internal/redistest.(*Server).launch.func1"),
	goleak.IgnoreAnyFunction("os/exec.(*Cmd).Start.func2"),
	// Sarama finishes a metadata refresh that was in flight when its
	// client closed (retrying against a broker the test stopped), then the
	// goroutine ends by itself.
	goleak.IgnoreAnyFunction("github.com/IBM/sarama.(*currentRefresh).start.func1"),
	goleak.IgnoreCurrent(),
}

// redisConfig is a router on a fresh redis-server (skipped when
// redis-server is missing, unless SPILLWAY_REQUIRE_REDIS=1).
func redisConfig(t *testing.T) Config {
	srv := redistest.Start(t)
	c := Config{Broker: brokerRedis}
	c.Redis.Addr = srv.Addr()
	c.Redis.BlockTime = 50 * time.Millisecond
	return c
}

// brokerCase is one broker the handler table runs on.
type brokerCase struct {
	name string
	// config returns the configuration of the router under test.
	config func(t *testing.T) Config
	// partitioned: the broker assigns a partition per key (ordering check).
	partitioned bool
}

var brokerCases = []brokerCase{
	{
		name:   "memory",
		config: func(*testing.T) Config { return Config{Broker: brokerMemory} },
	},
	{
		name: "kafka",
		config: func(*testing.T) Config {
			c := Config{Broker: brokerKafka}
			c.Kafka.Brokers = []string{spillway.Embedded}
			c.Kafka.Partitions = 4
			c.Kafka.HeartbeatInterval = 200 * time.Millisecond
			return c
		},
		partitioned: true,
	},
	{
		// Consumer key: per-key order instead of per-partition order.
		name: "kafka-key",
		config: func(*testing.T) Config {
			c := Config{Broker: brokerKafka}
			c.Kafka.Brokers = []string{spillway.Embedded}
			c.Kafka.Partitions = 4
			c.Kafka.HeartbeatInterval = 200 * time.Millisecond
			c.Kafka.Consumer = "key"
			return c
		},
		partitioned: true,
	},
	{
		// A real redis-server: miniredis gets idle times and lag wrong.
		name:   "redis",
		config: redisConfig,
	},
}

// tableMessage is one message of the handler table's stream.
type tableMessage struct {
	uuid    string
	entity  string
	seq     int // position within its entity
	payload []byte
}

func tableStream(t *testing.T) []tableMessage {
	var out []tableMessage
	seq := map[string]int{}
	add := func(entity string, payload []byte) {
		out = append(out, tableMessage{
			uuid:    fmt.Sprintf("msg-%03d", len(out)),
			entity:  entity,
			seq:     seq[entity],
			payload: payload,
		})
		seq[entity]++
	}
	for i := 0; i < 90; i++ {
		entity := "vehicle-" + strconv.Itoa(i%7)
		if i%3 == 0 {
			// Real county polygons, 800 to 2600 vertices together.
			add("county-"+strconv.Itoa(i%5), geojsonPayload(t, heavyGeometry(t, i*37, 800+(i%4)*600)))
			continue
		}
		add(entity, pingPayload(i))
	}
	return out
}

// TestBrokerTable runs the same handler over every broker: every message is
// processed exactly once, the budget bound holds, and the results are the
// same everywhere.
func TestBrokerTable(t *testing.T) {
	stream := tableStream(t)
	results := map[string]map[string]string{}
	for _, bc := range brokerCases {
		t.Run(bc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, leakOptions...)
			results[bc.name] = runTable(t, bc, stream)
		})
	}
	var first string
	for _, bc := range brokerCases {
		if results[bc.name] == nil {
			continue
		}
		if first == "" {
			first = bc.name
			continue
		}
		for id, want := range results[first] {
			if got := results[bc.name][id]; got != want {
				t.Errorf("message %s: %s gave %q, %s gave %q", id, bc.name, got, first, want)
			}
		}
	}
}

func runTable(t *testing.T, bc brokerCase, stream []tableMessage) map[string]string {
	const capacity = 4000
	cfg := bc.config(t)
	cfg.Budget.Vertices = capacity
	cfg.CloseTimeout = 10 * time.Second

	var (
		mu        sync.Mutex
		running   int64 // vertices in handlers now, by our own count
		peak      int64
		processed = map[string]int{}
		results   = map[string]string{}
		lastSeq   = map[string]int{}
		partOf    = map[string]int32{}
		disorder  []string
		waited    int
		done      = make(chan struct{})
	)
	onAdmission := func(_ *message.Message, a middleware.Admission) {
		if a.Wait > 0 {
			mu.Lock()
			waited++
			mu.Unlock()
		}
	}
	r, err := New(cfg, nil, WithHooks(admissionFunc(onAdmission)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	handler := func(msg *message.Message) error {
		n, _ := cost.ParseCount(msg.Metadata.Get(cost.MetadataKey), len(msg.Payload))
		mu.Lock()
		running += n
		peak = max(peak, running)
		mu.Unlock()
		defer func() {
			mu.Lock()
			running -= n
			mu.Unlock()
		}()

		g, err := cost.Decode(msg.Payload)
		if err != nil {
			return err
		}
		res, _ := work(g, 1, nil)
		time.Sleep(time.Millisecond) // let admissions overlap

		mu.Lock()
		defer mu.Unlock()
		processed[msg.UUID]++
		results[msg.UUID] = res
		entity := msg.Metadata.Get("entity_id")
		seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
		if last, ok := lastSeq[entity]; ok && seq <= last && bc.partitioned {
			disorder = append(disorder, fmt.Sprintf("%s: seq %d after %d", entity, seq, last))
		}
		lastSeq[entity] = seq
		if p, ok := kafkabroker.PartitionFromCtx(msg.Context()); ok {
			if prev, seen := partOf[entity]; seen && prev != p {
				disorder = append(disorder, fmt.Sprintf("%s: on partitions %d and %d", entity, prev, p))
			}
			partOf[entity] = p
		}
		if len(results) == len(stream) {
			select {
			case <-done:
			default:
				close(done)
			}
		}
		return nil
	}
	if _, err := r.AddConsumerHandler("table", "shapes", handler); err != nil {
		t.Fatal(err)
	}

	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.Background()) }()
	<-r.Running()

	// Publish per entity in order; entities interleave.
	for _, m := range stream {
		msg := message.NewMessage(m.uuid, m.payload)
		msg.Metadata.Set("entity_id", m.entity)
		msg.Metadata.Set("seq", strconv.Itoa(m.seq))
		if err := r.Publisher().Publish("shapes", msg); err != nil {
			t.Fatal(err)
		}
		if msg.Metadata.Get(cost.MetadataKey) == "" {
			t.Fatalf("publisher did not stamp %s", m.uuid)
		}
	}

	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out: %d of %d messages processed", len(results), len(stream))
	}
	if err := r.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, m := range stream {
		if processed[m.uuid] != 1 {
			t.Errorf("message %s processed %d times", m.uuid, processed[m.uuid])
		}
	}
	st := r.Stats().Budget
	if st.PeakInUse > st.Capacity || peak > capacity {
		t.Errorf("budget bound broken: budget peak %d, handler peak %d, capacity %d", st.PeakInUse, peak, capacity)
	}
	if st.InUse != 0 {
		t.Errorf("InUse after close = %d", st.InUse)
	}
	if waited == 0 {
		t.Errorf("no message ever waited: the table does not exercise the budget")
	}
	for _, d := range disorder {
		t.Errorf("ordering: %s", d)
	}
	t.Logf("%s: %d messages, peak %d of %d vertices, %d waited", bc.name, len(results), st.PeakInUse, capacity, waited)
	return results
}

// TestPipeline: a handler that publishes (AddHandler) feeds a consumer
// handler on every broker; what the router publishes is stamped.
func TestPipeline(t *testing.T) {
	for _, bc := range brokerCases {
		t.Run(bc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, leakOptions...)
			cfg := bc.config(t)
			cfg.CloseTimeout = 10 * time.Second
			r, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			_, err = r.AddHandler("hull", "shapes.in", "shapes.hulls", func(msg *message.Message) ([]*message.Message, error) {
				g, err := cost.Decode(msg.Payload)
				if err != nil {
					return nil, err
				}
				out := message.NewMessage(msg.UUID+"-hull", geojsonPayload(t, xyHull(g)))
				out.Metadata.Set("entity_id", msg.Metadata.Get("entity_id"))
				return []*message.Message{out}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *message.Message, 10)
			if _, err := r.AddConsumerHandler("sink", "shapes.hulls", func(msg *message.Message) error {
				got <- msg
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			go func() { _ = r.Run(context.Background()) }()
			<-r.Running()
			in := message.NewMessage("county", geojsonPayload(t, heavyGeometry(t, 3, 500)))
			in.Metadata.Set("entity_id", "c-1")
			if err := r.Publisher().Publish("shapes.in", in); err != nil {
				t.Fatal(err)
			}
			select {
			case m := <-got:
				n, src := cost.ParseCount(m.Metadata.Get(cost.MetadataKey), len(m.Payload))
				if m.UUID != "county-hull" || src != cost.SourceHeader || n < 4 {
					t.Errorf("got %s with vertex_count %q", m.UUID, m.Metadata.Get(cost.MetadataKey))
				}
			case <-time.After(30 * time.Second):
				t.Fatal("nothing reached the sink")
			}
			if err := r.Close(); err != nil {
				t.Error(err)
			}
		})
	}
}
