package redisbroker_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/redisbroker"
)

// One call of the ack script acknowledges entries of several consumers,
// each only while that consumer still owns it: an entry a peer claimed is
// left pending for the peer.
func TestAckScriptAcksOnlyOwnedEntries(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := rawClient(t, srv)
	ctx := testCtx(t)
	const stream, group = "ackpairs", "g"
	if err := c.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 3 {
		ids = append(ids, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"k", "v"}}).Val())
	}
	read := func(consumer string) {
		t.Helper()
		if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: consumer, Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	read("a")
	read("b")
	read("a")
	// A peer claims b's entry, as the idle claim would.
	if err := c.XClaimJustID(ctx, &redis.XClaimArgs{Stream: stream, Group: group, Consumer: "peer", MinIdle: 0, Messages: []string{ids[1]}}).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := redisbroker.AckScript.Run(ctx, c, []string{stream}, group, "a", ids[0], "b", ids[1], "a", ids[2]).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("acked %d, want 2 (a's two entries, not the one the peer claimed from b)", n)
	}
	if _, ok := pendingOf(t, c, stream, group, ids[0]); ok {
		t.Errorf("a's first entry still pending")
	}
	if _, ok := pendingOf(t, c, stream, group, ids[2]); ok {
		t.Errorf("a's second entry still pending")
	}
	if p, ok := pendingOf(t, c, stream, group, ids[1]); !ok || p.Consumer != "peer" {
		t.Errorf("claimed entry: %+v pending=%v, want still pending for peer", p, ok)
	}
}
