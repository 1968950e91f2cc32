package shedding

import (
	"runtime"
	"strconv"
	"testing"
)

func TestGuardStaleOnlyOlderOrEqual(t *testing.T) {
	g := newVersionGuard(10)
	k := entityKey{"vehicles", "bus-1"}
	if g.stale(k, 0) {
		t.Fatal("unknown entity is stale")
	}
	g.record(k, 5, nil)
	for v, want := range map[uint64]bool{0: true, 4: true, 5: true, 6: false, 1 << 63: false} {
		if g.stale(k, v) != want {
			t.Errorf("stale(%d) = %v, want %v", v, !want, want)
		}
	}
	g.record(k, 3, nil) // never goes backwards
	if g.stale(k, 4) != true {
		t.Error("recording an older version moved the guard back")
	}
	// Same entity id on another topic is another entity.
	if g.stale(entityKey{"trams", "bus-1"}, 1) {
		t.Error("topics share entities")
	}
}

// A version counts only once its message is acked: a handler that succeeds
// but whose message is then nacked (its output could not be published) must
// not make the redelivery look stale.
func TestGuardCountsOnlyAcked(t *testing.T) {
	g := newVersionGuard(10)
	k := entityKey{"vehicles", "bus-1"}
	acked := make(chan struct{})
	g.record(k, 7, acked)
	if g.stale(k, 7) {
		t.Fatal("unacked version counted")
	}
	close(acked)
	if !g.stale(k, 7) || g.stale(k, 8) {
		t.Fatal("acked version not counted")
	}

	// A nacked message's ack channel never closes; a later success of the
	// same version replaces it.
	k2 := entityKey{"vehicles", "bus-2"}
	g.record(k2, 3, make(chan struct{}))
	if g.stale(k2, 3) {
		t.Fatal("nacked version counted")
	}
	again := make(chan struct{})
	g.record(k2, 3, again)
	close(again)
	if !g.stale(k2, 3) {
		t.Fatal("redelivered success not counted")
	}
	// An unacked lower version does not displace a higher pending one.
	k3 := entityKey{"vehicles", "bus-3"}
	hi, lo := make(chan struct{}), make(chan struct{})
	g.record(k3, 9, hi)
	g.record(k3, 4, lo)
	close(lo)
	if g.stale(k3, 4) {
		t.Fatal("lower version counted in place of the pending higher one")
	}
	close(hi)
	if !g.stale(k3, 9) {
		t.Fatal("higher version lost")
	}
}

func TestGuardEvictsLeastRecentlySeen(t *testing.T) {
	g := newVersionGuard(3)
	key := func(i int) entityKey { return entityKey{"t", strconv.Itoa(i)} }
	for i := 0; i < 3; i++ {
		g.record(key(i), 1, nil)
	}
	g.stale(key(0), 1) // 0 is now the most recently seen; 1 the least
	g.record(key(3), 1, nil)
	if g.len() != 3 {
		t.Fatalf("len %d", g.len())
	}
	if !g.stale(key(0), 1) || !g.stale(key(2), 1) || !g.stale(key(3), 1) {
		t.Fatal("a recently seen entity was evicted")
	}
	if g.stale(key(1), 1) {
		t.Fatal("the least recently seen entity was kept")
	}
	if _, ev := g.stats(); ev != 1 {
		t.Fatalf("evicted %d", ev)
	}
}

// The guard's memory stays bounded under a stream of a million distinct
// entities: its size never exceeds the limit, and the heap after the stream
// is about what it was once the guard first filled up.
func TestGuardBoundedUnderMillionEntities(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	const limit = 20_000
	g := newVersionGuard(limit)
	var ms runtime.MemStats
	var baseline uint64
	for i := 0; i < n; i++ {
		k := entityKey{"vehicles", strconv.Itoa(i)}
		if g.stale(k, 1) {
			t.Fatalf("new entity %d stale", i)
		}
		g.record(k, uint64(i), nil)
		if i%4096 == 0 && g.len() > limit {
			t.Fatalf("after %d entities the guard holds %d > %d", i+1, g.len(), limit)
		}
		if i == 2*limit {
			runtime.GC()
			runtime.ReadMemStats(&ms)
			baseline = ms.HeapAlloc
		}
	}
	entries, evicted := g.stats()
	if entries != limit || evicted != uint64(n-limit) {
		t.Fatalf("entries %d, evicted %d; want %d, %d", entries, evicted, limit, n-limit)
	}
	// The most recent entities are remembered.
	for i := n - 10; i < n; i++ {
		if !g.stale(entityKey{"vehicles", strconv.Itoa(i)}, uint64(i)) {
			t.Fatalf("recent entity %d forgotten", i)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	if ms.HeapAlloc > baseline+baseline/2+1<<20 {
		t.Fatalf("heap grew from %d to %d bytes while the guard stayed at %d entities", baseline, ms.HeapAlloc, limit)
	}
	runtime.KeepAlive(g)
}
