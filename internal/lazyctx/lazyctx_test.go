package lazyctx

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A context asked for before End ends with End; one asked for after is
// ended already.
func TestLifeEnds(t *testing.T) {
	var before Life
	ctx := before.Context(context.Background(), nil)
	if ctx.Err() != nil || before.Err(context.Background(), nil) != nil {
		t.Fatal("ended before End")
	}
	before.End()
	expectDone(t, ctx)

	var after Life
	after.End()
	if err := after.Err(context.Background(), nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err after End = %v, want context.Canceled", err)
	}
	expectDone(t, after.Context(context.Background(), nil))
}

// The lifetime ends with the parent and with also, whether or not the
// context was built, and Err says so without building it.
func TestLifeEndsWithParents(t *testing.T) {
	for _, which := range []string{"parent", "also"} {
		for _, built := range []bool{true, false} {
			parent, cancelParent := context.WithCancel(context.Background())
			also, cancelAlso := context.WithCancel(context.Background())
			var l Life
			var ctx context.Context
			if built {
				ctx = l.Context(parent, also)
			}
			if which == "parent" {
				cancelParent()
			} else {
				cancelAlso()
			}
			if !built {
				if err := l.Err(parent, also); !errors.Is(err, context.Canceled) {
					t.Fatalf("%s, not built: Err = %v, want context.Canceled", which, err)
				}
				if l.inner.Load() != nil {
					t.Fatalf("%s: Err built the context", which)
				}
				ctx = l.Context(parent, also)
			}
			expectDone(t, ctx)
			l.End()
			cancelParent()
			cancelAlso()
		}
	}
}

// End racing with the first Context call: the built context always ends,
// and, under -race, the two share no field unsynchronised. (The window in
// which a wrong order of the publication and the check of ended would
// leave the context running is too narrow to hit reliably; Context's
// comment states the order.)
func TestLifeEndRacesContext(t *testing.T) {
	for range 2000 {
		var l Life
		var wg sync.WaitGroup
		var ctx context.Context
		wg.Add(2)
		go func() { defer wg.Done(); ctx = l.Context(context.Background(), nil) }()
		go func() { defer wg.Done(); l.End() }()
		wg.Wait()
		select {
		case <-ctx.Done():
		default:
			t.Fatal("End and Context raced, and the context was left running")
		}
	}
}

// End releases what Context registered with also: no AfterFunc is left on
// it.
func TestLifeEndReleasesAlso(t *testing.T) {
	also, cancel := context.WithCancel(context.Background())
	defer cancel()
	var l Life
	ctx := l.Context(context.Background(), also)
	l.End()
	expectDone(t, ctx)
	if l.stop() {
		t.Fatal("the AfterFunc on also was still registered after End")
	}
}

func expectDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context not done")
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("Err = %v, want context.Canceled", ctx.Err())
	}
}

// BenchmarkLife is one message's lifetime when nothing asks for Done
// (unbuilt), when something does (built), and context.WithCancel with its
// cancel (withcancel), all children of one parent shared by concurrent
// goroutines, as a subscription's messages are.
func BenchmarkLife(b *testing.B) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, c := range []string{"unbuilt", "built", "withcancel"} {
		b.Run(c, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					switch c {
					case "withcancel":
						_, cancel := context.WithCancel(parent)
						cancel()
					default:
						l := new(Life)
						if c == "built" {
							_ = l.Context(parent, nil).Done()
						}
						_ = l.Err(parent, nil)
						l.End()
					}
				}
			})
		})
	}
}

type valueKey struct{}

// A Context has its parent's values, builds nothing until asked, and ends,
// with what was derived from it, on End, on its parent's end and on also's.
func TestContext(t *testing.T) {
	parent := context.WithValue(context.Background(), valueKey{}, "v")
	c := new(Context)
	c.Init(parent, nil)
	if c.Value(valueKey{}) != "v" {
		t.Fatal("the parent's value is lost")
	}
	if c.Err() != nil || c.life.inner.Load() != nil {
		t.Fatal("ended, or built, before anything asked")
	}
	derived, cancel := context.WithCancel(c)
	defer cancel()
	c.End()
	expectDone(t, derived)
	expectDone(t, c)

	for _, which := range []string{"parent", "also"} {
		p, cancelP := context.WithCancel(context.Background())
		a, cancelA := context.WithCancel(context.Background())
		c := new(Context)
		c.Init(p, a)
		if which == "parent" {
			cancelP()
		} else {
			cancelA()
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("%s ended: Err = %v", which, c.Err())
		}
		expectDone(t, c)
		c.End()
		cancelP()
		cancelA()
	}
}
