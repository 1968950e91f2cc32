package redisbroker

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// unreachableClient is a client of an address nothing listens on, so that
// every call fails at once. It is closed when t ends.
func unreachableClient(t *testing.T) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testKeepAlive is a keep-alive without a goroutine of its own, whose
// bookkeeping a test drives by hand.
func testKeepAlive(client redis.UniversalClient) *keepAlive {
	return &keepAlive{
		client: client, group: "g", idle: time.Minute, logger: watermill.NopLogger{},
		entries: make(map[kaKey]*kaEntry), pipes: make(map[kaPipe]*kaPipeState),
		states: make(map[kaKey]*revState), handed: make(map[*message.Message]*revState),
	}
}

// The bookkeeping behind "stuck": a pipe that acks nothing for MaxInFlight
// lets go of what it holds, keeps nothing new alive and stops claiming,
// until its next ack. (The refresh calls go to a closed port and fail.)
func TestKeepAliveStuckBookkeeping(t *testing.T) {
	k := testKeepAlive(unreachableClient(t))
	k.interval, k.maxFlight = time.Second, 50*time.Millisecond
	ctx := context.Background()
	sub := &subscription{}
	k.track(sub, "s", "c", "1-0", "2-0") // one in the handler, one read ahead
	k.refresh(ctx)
	if st := k.stats(); st.Tracked != 2 || st.Expired != 0 || st.Errors != 1 || k.stuck("c") {
		t.Fatalf("fresh: %+v stuck=%v", st, k.stuck("c"))
	}
	time.Sleep(80 * time.Millisecond)
	k.refresh(ctx)
	if st := k.stats(); st.Tracked != 0 || st.Expired != 2 || !k.stuck("c") || k.stuck("other") {
		t.Fatalf("after MaxInFlight without an ack: %+v stuck=%v", st, k.stuck("c"))
	}
	k.track(sub, "s", "c", "3-0") // claimed or read later: not kept alive
	k.refresh(ctx)
	if st := k.stats(); st.Tracked != 0 || st.Expired != 3 {
		t.Fatalf("entry taken by a stuck pipe: %+v", st)
	}
	k.track(sub, "s", "c", "4-0")
	k.forget(sub, "s", "c", "1-0") // the stuck handler finally acks
	if k.stuck("c") {
		t.Fatal("still stuck after an ack")
	}
	k.refresh(ctx)
	if st := k.stats(); st.Tracked != 1 || st.Expired != 3 {
		t.Fatalf("after progress: %+v", st)
	}
	k.ended(sub)
	k.track(sub, "s", "c", "5-0")
	if st := k.stats(); st.Tracked != 0 || len(k.pipes) != 0 {
		t.Fatalf("after the subscription ended: %+v, %d pipes", st, len(k.pipes))
	}
}

// The keep-alive's index of handed-over messages holds a message only
// while its entry's record does: an ack, a new delivery of the entry, the
// end of the subscription and a later attempt each drop the message before,
// so the index cannot grow with the messages a subscriber has delivered.
func TestKeepAliveHandedFollowsStates(t *testing.T) {
	k := testKeepAlive(nil)
	sub := &subscription{}
	key := func(id string) kaKey { return kaKey{stream: "s", id: id, consumer: "c"} }
	handed := func(ids ...string) []*message.Message {
		var msgs []*message.Message
		for _, id := range ids {
			m := message.NewMessage(id, nil)
			k.attempt(key(id), m)
			msgs = append(msgs, m)
		}
		return msgs
	}

	k.track(sub, "s", "c", "1-0", "2-0")
	m := handed("1-0", "2-0")
	if k.watch(m[0]) == nil || k.watch(m[1]) == nil || len(k.handed) != 2 {
		t.Fatalf("handed over: %d indexed", len(k.handed))
	}
	k.forget(sub, "s", "c", "1-0") // acked
	if k.watch(m[0]) != nil || len(k.handed) != 1 {
		t.Fatalf("after the ack: %d indexed", len(k.handed))
	}
	again := message.NewMessage("2-0 again", nil) // nacked, handed over as a copy
	k.attempt(key("2-0"), again)
	if k.watch(m[1]) != nil || k.watch(again) == nil || len(k.handed) != 1 {
		t.Fatalf("after a new attempt: %d indexed", len(k.handed))
	}
	k.track(sub, "s", "c", "2-0") // delivered again: a new life, not yet handed over
	if k.watch(again) != nil || len(k.handed) != 0 {
		t.Fatalf("after a new delivery: %d indexed", len(k.handed))
	}
	k.track(sub, "s", "c", "3-0")
	handed("2-0", "3-0")
	if len(k.handed) != 2 {
		t.Fatalf("handed over again: %d indexed", len(k.handed))
	}
	k.ended(sub)
	if len(k.handed) != 0 || len(k.states) != 0 {
		t.Fatalf("after the subscription ended: %d indexed, %d records", len(k.handed), len(k.states))
	}
}
