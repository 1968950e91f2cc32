package router

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/kafkatest"
)

// keyFor returns a key that Sarama's hash partitioner puts on partition p
// of topic.
func keyFor(t *testing.T, topic string, p, partitions int32) string {
	part := sarama.NewHashPartitioner(topic)
	for i := 0; ; i++ {
		k := "key-" + string(rune('a'+i%26)) + time.Duration(i).String()
		got, err := part.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(k)}, partitions)
		if err != nil {
			t.Fatal(err)
		}
		if got == p {
			return k
		}
	}
}

// TestGracefulShutdownKafka: Close while one message runs and another
// waits for budget. The running one finishes and is committed; the waiting
// one never runs and is not lost: a router restarted in the same group
// processes it, and only it.
func TestGracefulShutdownKafka(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cluster := kafkatest.Start(t, 2, "jobs")

	cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = 100
	cfg.Kafka.Brokers = cluster.Brokers()
	cfg.Kafka.Version = "2.3.0"    // kfake's limit
	cfg.Kafka.Partitioner = "hash" // keyFor's
	cfg.Kafka.Partitions = 2
	cfg.Kafka.HeartbeatInterval = 200 * time.Millisecond

	var (
		mu      sync.Mutex
		runs    = map[string][]string{} // uuid -> which router ran it
		running = make(chan string, 4)
		unblock = make(chan struct{})
	)
	handler := func(who string) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			running <- msg.UUID
			if who == "first" {
				<-unblock
			}
			mu.Lock()
			runs[msg.UUID] = append(runs[msg.UUID], who)
			mu.Unlock()
			return nil
		}
	}

	first, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.AddConsumerHandler("worker", "jobs", handler("first")); err != nil {
		t.Fatal(err)
	}
	publish := func(uuid, key string) {
		msg := message.NewMessage(uuid, pingPayload(1))
		msg.Metadata.Set("entity_id", key)
		msg.Metadata.Set(cost.MetadataKey, "100") // the whole budget
		if err := first.Publisher().Publish("jobs", msg); err != nil {
			t.Fatal(err)
		}
	}
	publish("x", keyFor(t, "jobs", 0, 2))
	publish("y", keyFor(t, "jobs", 1, 2))

	runErr := make(chan error, 1)
	go func() { runErr <- first.Run(context.Background()) }()

	admitted := <-running // one of them holds the whole budget
	waiting := map[string]string{"x": "y", "y": "x"}[admitted]
	deadline := time.Now().Add(10 * time.Second)
	for first.budget.Stats().Waiting != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s never waited for budget", waiting)
		}
		time.Sleep(5 * time.Millisecond)
	}

	closed := make(chan error, 1)
	go func() { closed <- first.Close() }()
	// The waiter gives up at once; the admitted handler is still running.
	for first.budget.Stats().Waiting != 0 {
		if time.Now().After(deadline) {
			t.Fatal("waiter did not give up on Close")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before admitted work finished", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(unblock)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	mu.Lock()
	if len(runs[waiting]) != 0 {
		t.Fatalf("waiting message %s ran during shutdown", waiting)
	}
	mu.Unlock()
	if st := first.Stats(); st.Cancellations != 1 || st.Budget.InUse != 0 {
		t.Errorf("after close: %d cancellations, %d in use", st.Cancellations, st.Budget.InUse)
	}

	// Restart in the same group: only the waiting message is left.
	second, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.AddConsumerHandler("worker", "jobs", handler("second")); err != nil {
		t.Fatal(err)
	}
	go func() { runErr <- second.Run(context.Background()) }()
	select {
	case got := <-running:
		if got != waiting {
			t.Errorf("after restart %s ran, want %s", got, waiting)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("message %s lost: not redelivered after restart", waiting)
	}
	time.Sleep(500 * time.Millisecond) // would a second delivery show up?
	if err := second.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(runs[admitted]) != 1 || len(runs[waiting]) != 1 {
		t.Errorf("runs: %v", runs)
	}
}

// TestSignalShutdown: with WithSignals, SIGTERM closes the router
// gracefully: Run returns nil once the admitted handler has finished.
func TestSignalShutdown(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	r, err := New(Config{CloseTimeout: 10 * time.Second}, nil, WithSignals())
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	finish := make(chan struct{})
	var finished atomic.Bool
	if _, err := r.AddConsumerHandler("slow", "jobs", func(*message.Message) error {
		close(started)
		<-finish
		finished.Store(true)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.Background()) }()
	<-r.Running()
	if err := r.Publisher().Publish("jobs", message.NewMessage("m", pingPayload(2))); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-runErr:
		t.Fatalf("Run returned (%v) before the admitted handler finished", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(finish)
	select {
	case err := <-runErr:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after SIGTERM")
	}
	if !finished.Load() {
		t.Error("admitted handler did not finish")
	}
	select {
	case <-r.closed:
	default:
		t.Error("router not closed")
	}
}

// TestNoSignalsUnlessAsked: without WithSignals the router leaves signals
// to the program: a signal the program handles does not stop Run, and one
// named with WithSignals does.
func TestNoSignalsUnlessAsked(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	mine := make(chan os.Signal, 4)
	signal.Notify(mine, syscall.SIGUSR1) // so the signal cannot end the test process
	defer signal.Stop(mine)
	for _, asked := range []bool{false, true} {
		var opts []Option
		if asked {
			opts = append(opts, WithSignals(syscall.SIGUSR1))
		}
		r, err := New(Config{CloseTimeout: 5 * time.Second}, nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		runErr := make(chan error, 1)
		go func() { runErr <- r.Run(context.Background()) }()
		<-r.Running()
		if err := syscall.Kill(syscall.Getpid(), syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		<-mine
		select {
		case err := <-runErr:
			if !asked {
				t.Fatalf("Run returned (%v) on a signal the router was not given", err)
			}
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(500 * time.Millisecond):
			if asked {
				t.Fatal("Run did not return on the signal named with WithSignals")
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-runErr; err != nil {
				t.Fatalf("Run: %v", err)
			}
		}
	}
}

// TestCloseWithoutRun: a router that never ran closes at once.
func TestCloseWithoutRun(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	c := Config{Broker: brokerKafka}
	c.Kafka.Brokers = []string{spillway.Embedded}
	c.Kafka.Partitions = 2
	r, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddConsumerHandler("h", "t", func(*message.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddConsumerHandler("h", "t", func(*message.Message) error { return nil }); err == nil {
		t.Error("duplicate handler name accepted")
	}
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %s", d)
	}
}
