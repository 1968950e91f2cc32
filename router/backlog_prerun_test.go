package router

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway/cost"
)

// TestBacklogBeforeRunRedis: a router that never runs reads the backlog
// of a group another process created on its handler's stream, creating
// no group itself; a group that does not exist is an error naming it.
func TestBacklogBeforeRunRedis(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := redisConfig(t)
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
	defer client.Close()
	// The groups a consumer of handler h creates as it subscribes: its
	// own, and its retry handler's.
	for stream, group := range map[string]string{"shapes": "spillway.h", "shapes.retry": "spillway.h.retry"} {
		if err := client.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	pub, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var truth int64
	for i := range 3 {
		msg := message.NewMessage("m-"+strconv.Itoa(i), pingPayload(i))
		if err := pub.Publisher().Publish("shapes", msg); err != nil {
			t.Fatal(err)
		}
		n, _ := cost.ParseCount(msg.Metadata.Get(cost.MetadataKey), len(msg.Payload))
		truth += n
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}

	read := func(handler string) ([]string, error) {
		r, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if _, err := r.AddConsumerHandler(handler, "shapes", func(*message.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
		backlog, err := r.Backlog(ctx)
		var out []string
		for _, b := range backlog {
			out = append(out, b.Group+" "+b.Topic+" "+strconv.FormatInt(b.Lag, 10)+" "+strconv.FormatInt(b.Vertices, 10))
		}
		return out, err
	}
	got, err := read("h")
	want := []string{"spillway.h shapes 3 " + strconv.FormatInt(truth, 10), "spillway.h.retry shapes.retry 0 0"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("Backlog before Run = %q, %v; want %q", got, err, want)
	}
	if _, err := read("missing"); err == nil || !strings.Contains(err.Error(), `"spillway.missing"`) {
		t.Errorf("Backlog of a group that does not exist: %v", err)
	}
	groups, err := client.XInfoGroups(ctx, "shapes").Result()
	if err != nil || len(groups) != 1 || groups[0].Name != "spillway.h" || groups[0].EntriesRead != 0 || groups[0].Consumers != 0 {
		t.Errorf("groups after reading: %+v, %v; want spillway.h alone, untouched", groups, err)
	}
}
