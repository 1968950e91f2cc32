package redisbroker

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// An entry whose claim has lapsed is revoked when it is handed over, is
// not handed over, and its ack is never sent: it is given up, so a sibling
// consumer may claim it as a peer may. One still fresh is handed over and
// held (never claimed back) until its ack is settled.
func TestHandoverRefusesALapsedEntry(t *testing.T) {
	k := testKeepAlive(unreachableClient(t))
	k.idle, k.interval = time.Second, 300*time.Millisecond
	k.margin = lapseMargin(k.idle, k.interval)
	sub := &subscription{}
	k.trackSent(time.Now().Add(-k.idle), sub, "s", "c", "1-0") // read a MaxIdleTime ago, never refreshed
	k.track(sub, "s", "c", "2-0")
	lapsed, fresh := kaKey{stream: "s", id: "1-0", consumer: "c"}, kaKey{stream: "s", id: "2-0", consumer: "c"}

	if k.handover(lapsed, message.NewMessage("1", nil)) {
		t.Fatal("a lapsed entry was handed over")
	}
	if k.mayAck(lapsed) {
		t.Fatal("the ack of an entry that was not handed over may be sent")
	}
	if st := k.stats(); st.Revoked != 1 || st.Tracked != 1 {
		t.Fatalf("after refusing the lapsed entry: %+v, want it revoked and untracked", st)
	}
	if !k.handover(fresh, message.NewMessage("2", nil)) || !k.mayAck(fresh) {
		t.Fatal("a fresh entry was not handed over, or may not be acked")
	}
	if k.holds("s", "c", "1-0") {
		t.Fatal("a lapsed entry that never ran is reported held: no sibling would claim it")
	}
	if !k.holds("s", "c", "2-0") || k.holds("s", "other", "2-0") {
		t.Fatal("an entry not yet settled is not reported held, or another consumer's is")
	}
	k.forget(sub, "s", "c", "1-0", "2-0") // the acker settled both
	if k.holds("s", "c", "1-0") || k.holds("s", "c", "2-0") {
		t.Fatal("settled entries are still reported held")
	}
}

// watchLapses revokes an entry before a peer could claim it: within
// MaxIdleTime of when its last refresh (here: its read) was sent.
func TestLapsedEntryRevokedBeforeMaxIdleTime(t *testing.T) {
	k := testKeepAlive(unreachableClient(t))
	k.idle, k.interval = 400*time.Millisecond, 100*time.Millisecond
	k.margin = lapseMargin(k.idle, k.interval)
	k.lapseWake, k.stop = make(chan struct{}, 1), make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); k.watchLapses() }()
	defer func() { close(k.stop); <-done }()

	sent := time.Now()
	k.trackSent(sent, &subscription{}, "s", "c", "1-0")
	msg := message.NewMessage("1", nil)
	if !k.handover(kaKey{stream: "s", id: "1-0", consumer: "c"}, msg) {
		t.Fatal("a fresh entry was not handed over")
	}
	select {
	case <-k.watch(msg):
		if since := time.Since(sent); since >= k.idle {
			t.Fatalf("revoked %v after the read was sent, not before MaxIdleTime (%v)", since, k.idle)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("never revoked")
	}
}
