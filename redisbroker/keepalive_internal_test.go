package redisbroker

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// The bookkeeping behind "stuck": a pipe that acks nothing for MaxInFlight
// lets go of what it holds, keeps nothing new alive and stops claiming,
// until its next ack. (The refresh calls go to a closed port and fail.)
func TestKeepAliveStuckBookkeeping(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer client.Close()
	k := &keepAlive{
		client: client, group: "g", interval: time.Second, maxFlight: 50 * time.Millisecond,
		idle: time.Minute, logger: watermill.NopLogger{}, entries: make(map[kaKey]*kaEntry), pipes: make(map[kaPipe]*kaPipeState),
		states: make(map[kaKey]*revState), handed: make(map[*message.Message]*revState),
	}
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
