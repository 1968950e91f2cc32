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
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/redisbroker"
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

// TestBacklogCountsUnstampedAtTheirCharge: a message without a valid
// vertex_count counts in the backlog at what the budget charges it,
// budget.default_cost or the whole budget, not at the average of the
// stamped ones: a backlog of unstamped messages must not read as nearly
// empty to an autoscaler.
func TestBacklogCountsUnstampedAtTheirCharge(t *testing.T) {
	for _, tc := range []struct {
		broker      string
		defaultCost int64
	}{{"kafka", 0}, {"kafka", 700}, {"redis", 0}, {"redis", 700}} {
		t.Run(tc.broker+"/default_cost="+strconv.FormatInt(tc.defaultCost, 10), func(t *testing.T) {
			defer goleak.VerifyNone(t, leakOptions...)
			ctx := context.Background()
			var cfg Config
			var raw message.Publisher
			switch tc.broker {
			case "kafka":
				broker := kafkatest.Start(t, 1)
				cfg = Config{Broker: brokerKafka}
				cfg.Kafka.Brokers = broker.Brokers()
				cfg.Kafka.Partitions = 1
				cfg.Kafka.CreateTopics = true
				cl, err := kafkabroker.New(kafkabroker.Config{Brokers: broker.Brokers(), Version: "2.3.0", Partitions: 1, CreateTopics: true})
				if err != nil {
					t.Fatal(err)
				}
				defer cl.Close()
				if err := cl.EnsureTopic("shapes"); err != nil {
					t.Fatal(err)
				}
				if raw, err = cl.NewPublisher(); err != nil {
					t.Fatal(err)
				}
			case "redis":
				cfg = redisConfig(t)
				client := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
				defer client.Close()
				for stream, group := range map[string]string{"shapes": "spillway.h", "shapes.retry": "spillway.h.retry"} {
					if err := client.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
						t.Fatal(err)
					}
				}
				var err error
				if raw, err = redisbroker.NewPublisher(redisbroker.Config{Addr: cfg.Redis.Addr}); err != nil {
					t.Fatal(err)
				}
			}
			defer raw.Close()
			cfg.Budget.Vertices = 10_000
			cfg.Budget.DefaultCost = tc.defaultCost
			charge := tc.defaultCost
			if charge == 0 {
				charge = cfg.Budget.Vertices
			}
			// 10 stamped messages of 5 vertices, 6 without a count and 4
			// with a malformed one.
			var truth int64
			for i := range 20 {
				msg := message.NewMessage("m-"+strconv.Itoa(i), []byte("{}"))
				switch {
				case i < 10:
					msg.Metadata.Set(cost.MetadataKey, "5")
					truth += 5
				case i < 16:
					truth += charge
				default:
					msg.Metadata.Set(cost.MetadataKey, "-3")
					truth += charge
				}
				if err := raw.Publish("shapes", msg); err != nil {
					t.Fatal(err)
				}
			}
			r, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if _, err := r.AddConsumerHandler("h", "shapes", func(*message.Message) error { return nil }); err != nil {
				t.Fatal(err)
			}
			backlog, err := r.Backlog(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var vertices int64
			for _, b := range backlog {
				if b.Topic == "shapes" {
					vertices += b.Vertices
				}
			}
			if vertices != truth {
				t.Errorf("backlog of 10 stamped (5 each) and 10 unstamped messages = %d vertices, want %d (unstamped at %d)", vertices, truth, charge)
			}
		})
	}
}
