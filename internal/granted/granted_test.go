package granted

import (
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

func TestSetGetRestoreNest(t *testing.T) {
	msg := message.NewMessage("a", nil)
	if _, ok := Get(msg); ok {
		t.Fatal("Get before Set found a charge")
	}
	outer := Set(msg, Charge{Requested: 10, Vertices: 10})
	inner := Set(msg, Charge{Requested: 10, Vertices: 5, Clamped: true})
	if c, ok := Get(msg); !ok || c.Vertices != 5 {
		t.Fatalf("inside the nested Set: Get = %+v, %v; want 5 vertices", c, ok)
	}
	inner.Restore()
	if c, ok := Get(msg); !ok || c.Vertices != 10 {
		t.Fatalf("after the nested Restore: Get = %+v, %v; want 10 vertices", c, ok)
	}
	outer.Restore()
	if _, ok := Get(msg); ok {
		t.Fatal("after the last Restore: Get still finds a charge")
	}
	Record{}.Restore() // the zero Record is a no-op
}

func TestConcurrentMessages(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 2000 {
				msg := message.NewMessage("m", nil)
				v := int64(g*10_000 + i)
				r := Set(msg, Charge{Vertices: v})
				if c, ok := Get(msg); !ok || c.Vertices != v {
					t.Errorf("Get = %+v, %v; want %d vertices", c, ok, v)
					return
				}
				r.Restore()
				if _, ok := Get(msg); ok {
					t.Error("Get after Restore found a charge")
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range table {
		s := &table[i]
		s.mu.Lock()
		n := len(s.entries)
		s.mu.Unlock()
		if n != 0 {
			t.Fatalf("shard %d holds %d entries after every Restore", i, n)
		}
	}
}

func TestWant(t *testing.T) {
	Want()
	if !Wanted() {
		t.Fatal("Wanted after Want is false")
	}
}
