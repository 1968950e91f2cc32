package redisbroker_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/redistest"
)

// BacklogVertices on a real server: a small backlog, pending entries
// included, is counted exactly (every entry read), entries without a
// valid vertex_count at the charge given for them; one longer than the
// 1,000 oldest and 1,000 newest undelivered entries read is scaled from
// them.
func TestBacklogVertices(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	topic := uniq("backlog")
	pub := newPublisher(t, cfg)
	// Every tenth entry costs 1,000 vertices, the others 1; every
	// seventh has no vertex_count or a malformed one, and counts as
	// unstamped.
	const unstamped = 500
	costOf := func(i int) int64 {
		switch {
		case i%7 == 3:
			return unstamped
		case i%10 == 0:
			return 1000
		}
		return 1
	}
	next := 0
	add := func(n int) (sum int64) {
		msgs := make([]*message.Message, n)
		for k := range msgs {
			msgs[k] = message.NewMessage("m-"+strconv.Itoa(next), []byte("{}"))
			switch {
			case next%14 == 3: // none
			case next%7 == 3:
				msgs[k].Metadata.Set(cost.MetadataKey, "many")
			default:
				msgs[k].Metadata.Set(cost.MetadataKey, strconv.FormatInt(costOf(next), 10))
			}
			sum += costOf(next)
			next++
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			t.Fatal(err)
		}
		return sum
	}
	truth := add(30)
	sub := newSubscriber(t, cfg)
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var held *message.Message
	select {
	case held = <-ch: // held: it stays pending
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	defer held.Ack()
	ctx := testCtx(t)
	waitFor(t, "a pending entry", 30*time.Second, func() bool {
		info, err := sub.LagInfo(ctx, topic)
		return err == nil && info.Pending > 0
	})
	v, sampled, err := sub.BacklogVertices(ctx, topic, unstamped)
	if err != nil {
		t.Fatal(err)
	}
	if v != truth || sampled != 30 {
		t.Errorf("BacklogVertices = %d, %d read; want %d exactly, 30 read", v, sampled, truth)
	}

	truth += add(3000)
	v, sampled, err = sub.BacklogVertices(ctx, topic, unstamped)
	if err != nil {
		t.Fatal(err)
	}
	relErr := float64(v-truth) / float64(truth)
	t.Logf("backlog of 3,030 entries, %d vertices: estimated %d (%+.2f%%) from %d entries", truth, v, 100*relErr, sampled)
	if sampled >= 3030 || sampled < 2000 {
		t.Errorf("read %d entries, want 1,000 from each end of the undelivered ones and the pending ones", sampled)
	}
	if relErr < -0.05 || relErr > 0.05 {
		t.Errorf("estimated %d for %d, want within 5%%", v, truth)
	}
}
