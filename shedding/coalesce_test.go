package shedding

import "testing"

func TestCoalescerOrdering(t *testing.T) {
	c := newCoalescer()
	k := entityKey{"vehicles", "bus"}
	t5, a := c.register(k, "m5", 5, true, false, true)
	if a != arrivedNewest {
		t.Fatalf("first arrival: %v", a)
	}
	// The same message delivered again, or another message with the same
	// version: neither wins, nothing is touched.
	if tk, a := c.register(k, "m5", 5, true, false, true); a != arrivedUntracked || tk != nil {
		t.Fatalf("same message: %v", a)
	}
	if tk, a := c.register(k, "m5b", 5, true, false, true); a != arrivedUntracked || tk != nil {
		t.Fatalf("same version: %v", a)
	}
	if _, a := c.register(k, "m4", 4, true, false, true); a != arrivedOlder {
		t.Fatalf("older version: %v", a)
	}
	if c.wasSuperseded(t5) {
		t.Fatal("superseded by an older or equal message")
	}
	// A newer version supersedes a waiter...
	t6, a := c.register(k, "m6", 6, true, false, true)
	if a != arrivedNewest || !c.wasSuperseded(t5) || c.admit(t5) {
		t.Fatal("newer version did not supersede the waiter")
	}
	select {
	case <-t5.abort:
	default:
		t.Fatal("superseded waiter's channel open")
	}
	// ...but not an admitted message; and without a version the later
	// arrival is newer.
	if !c.admit(t6) {
		t.Fatal("admit")
	}
	t7, a := c.register(k, "m-unversioned", 0, false, false, true)
	if a != arrivedNewest || c.wasSuperseded(t6) {
		t.Fatal("admitted message superseded")
	}
	// Without the admission hook, waiters are never made to step aside.
	t8, _ := c.register(k, "m9", 9, true, false, false)
	if c.wasSuperseded(t7) {
		t.Fatal("superseded without the admission hook")
	}
	for _, tk := range []*ticket{t5, t6, t7} {
		c.finish(tk)
	}
	if c.len() != 1 {
		t.Fatalf("len %d: the newest registration must stay until it leaves", c.len())
	}
	c.revoke(t8)
	c.finish(t8)
	if c.len() != 0 {
		t.Fatalf("len %d", c.len())
	}
}
