package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/retrygate"
)

// shedLog records the shedding policy's drops.
type shedLog struct {
	mu    sync.Mutex
	drops []string
}

func (l *shedLog) OnShed(m *message.Message, _, reason string) {
	l.mu.Lock()
	l.drops = append(l.drops, m.UUID+":"+reason)
	l.mu.Unlock()
}

func (l *shedLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.drops...)
}

// TestEdgeCoalesceRetryCopyNeverSupersedes: a retry copy of an entity's
// older update, consumed from the retry topic while a fresh update of that
// entity waits for budget, must not make the fresh one step aside: without
// versions, coalescing cannot tell which is newer.
func TestEdgeCoalesceRetryCopyNeverSupersedes(t *testing.T) {
	cfg := Config{CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = 100
	cfg.Shedding.Topics = []string{"vehicles"}
	cfg.Shedding.Priority.Disabled = true
	cfg.Shedding.Coalesce.Enabled = true
	cfg.Retry.InitialInterval = 10 * time.Millisecond
	shed := &shedLog{}
	r, err := New(cfg, nil, WithHooks(shed))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		ran []string
	)
	if _, err := r.AddConsumerHandler("veh", "vehicles", func(m *message.Message) error {
		mu.Lock()
		ran = append(ran, m.UUID)
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	hold, err := r.budget.Acquire(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 1)
	go func() { errs <- r.Run(context.Background()) }()
	<-r.wm.Running()

	fresh := message.NewMessage("fresh", pingPayload(0))
	fresh.Metadata.Set("entity_id", "bus")
	fresh.Metadata.Set(cost.MetadataKey, "10")
	if err := r.pub.Publish("vehicles", fresh); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the fresh update to wait for budget", func() bool { return r.budget.Stats().Waiting == 1 })

	retried := message.NewMessage("retried", pingPayload(1))
	retried.Metadata.Set("entity_id", "bus")
	retried.Metadata.Set(cost.MetadataKey, "10")
	retried.Metadata.Set(retrygate.OriginTopicKey, "vehicles")
	retried.Metadata.Set("spillway_attempt", "1")
	if err := r.pub.Publish(cfg.Retry.RetryTopicFor("vehicles"), retried); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the retry copy arrives, and is deferred again
	if d := shed.list(); len(d) != 0 {
		t.Fatalf("dropped %v: a retry copy superseded a fresh update", d)
	}
	hold.Release()
	waitFor(t, "both updates to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == 2
	})
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	if err := <-errs; err != nil {
		t.Error(err)
	}
	if d := shed.list(); len(d) != 0 {
		t.Errorf("dropped %v", d)
	}
}
