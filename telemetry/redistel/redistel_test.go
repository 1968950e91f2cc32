package redistel_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/producer"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/telemetry/redistel"
)

// The sampler over a Redis source can feed
// producer.NewLagThrottled directly.
var _ = func(s *telemetry.LagSampler) {
	_, _ = producer.NewLagThrottled(nil, s, producer.LagThrottleConfig{})
}

func TestNewLagSourceValidates(t *testing.T) {
	if _, err := redistel.NewLagSource(nil); err == nil {
		t.Fatal("nil subscriber accepted")
	}
}

// One telemetry.LagSampler over the source sees the group's backlog (lag
// plus pending) per subscribed stream, and sees it drain.
func TestLagSource(t *testing.T) {
	srv := redistest.Start(t)
	cfg := redisbroker.Config{
		Addr:          srv.Addr(),
		ConsumerGroup: fmt.Sprintf("g-%d", os.Getpid()),
		Consumer:      fmt.Sprintf("c-%d", os.Getpid()),
		Consumers:     1,
		BlockTime:     50 * time.Millisecond,
		ClaimInterval: 250 * time.Millisecond,
		MaxIdleTime:   5 * time.Second,
	}
	pub, err := redisbroker.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, err := redisbroker.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	src, err := redistel.NewLagSource(sub)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := src(ctx); err != nil || len(s) != 0 {
		t.Fatalf("before any subscription: %+v, %v", s, err)
	}

	topics := []string{"lag-b", "lag-a"}
	chans := make([]<-chan *message.Message, len(topics))
	for i, topic := range topics {
		for j := range 10 - 4*i { // lag-b: 10 entries, lag-a: 6
			if err := pub.Publish(topic, message.NewMessage(fmt.Sprintf("%s-%d", topic, j), []byte("x"))); err != nil {
				t.Fatal(err)
			}
		}
		if chans[i], err = sub.Subscribe(ctx, topic); err != nil {
			t.Fatal(err)
		}
	}
	// Hold one message of each: nothing is acked, so lag + pending counts
	// every entry whatever upstream has read ahead.
	held := make([]*message.Message, len(chans))
	for i, ch := range chans {
		select {
		case held[i] = <-ch:
		case <-ctx.Done():
			t.Fatal("no delivery")
		}
	}

	sampler := telemetry.NewLagSampler(src, telemetry.WithLagInterval(time.Hour))
	defer sampler.Close()
	if err := sampler.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := src(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 2 || sampler.TotalLag() != 16 {
		t.Fatalf("samples = %+v, total %d; want 2 streams, 16", s, sampler.TotalLag())
	}
	for i, want := range []struct {
		topic string
		lag   int64
	}{{"lag-a", 6}, {"lag-b", 10}} {
		if s[i].Topic != want.topic || s[i].Group != cfg.ConsumerGroup || s[i].Partition != -1 || s[i].Lag != want.lag {
			t.Fatalf("sample %d = %+v; want %s, group %s, partition -1, lag %d", i, s[i], want.topic, cfg.ConsumerGroup, want.lag)
		}
	}

	// Drain both streams; the sampler sees the group catch up.
	for i, ch := range chans {
		held[i].Ack()
		for range 10 - 4*i - 1 {
			select {
			case m := <-ch:
				m.Ack()
			case <-ctx.Done():
				t.Fatal("no delivery")
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := sampler.Sample(ctx); err != nil {
			t.Fatal(err)
		}
		if sampler.TotalLag() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("total lag still %d", sampler.TotalLag())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
