package middleware

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/retrygate"
)

// Issue 13, item 9: near math.MaxInt64 capacity "in use + charge" wrapped,
// a second charge was admitted into a full budget and every release then
// panicked. The capacity is capped with a validation error, and a budget at
// the cap compares without overflow.
func TestEdgeBudgetCapacityOverflow(t *testing.T) {
	for _, capacity := range []int64{math.MaxInt64, math.MaxInt64 / 2, 1<<40 + 1} {
		b, err := NewVertexBudget(capacity)
		if !errors.Is(err, spillway.ErrInvalidConfig) {
			t.Errorf("NewVertexBudget(%d): err = %v, want a validation error", capacity, err)
		}
		if b == nil {
			continue
		}
		// What the unchecked budget did: the second charge wraps past the
		// capacity check.
		p1, _ := b.Acquire(context.Background(), math.MaxInt64)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		p2, err := b.Acquire(ctx, math.MaxInt64)
		cancel()
		if err == nil {
			t.Errorf("capacity %d: a second full charge was admitted into a full budget", capacity)
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("capacity %d: release panicked: %v", capacity, r)
				}
			}()
			p2.Release()
			p1.Release()
		}()
	}

	// The largest accepted capacity works: a full charge, then nothing else
	// fits until it is released.
	const largest = 1 << 40
	b, err := NewVertexBudget(largest)
	if err != nil {
		t.Fatalf("NewVertexBudget(%d): %v", int64(largest), err)
	}
	if err := b.Resize(math.MaxInt64); err == nil {
		t.Error("Resize(math.MaxInt64) accepted")
	}
	full := mustAcquire(t, b, math.MaxInt64)
	if _, ok := b.tryAcquire(1); ok {
		t.Error("a full budget admitted one more vertex")
	}
	full.Release()
	p := mustAcquire(t, b, largest)
	p.Release()
	if s := b.Stats(); s.InUse != 0 || s.Capacity != largest {
		t.Errorf("stats after release = %+v", s)
	}
}

// countingEstimator counts the messages it prices.
type countingEstimator struct {
	cost.ChargeEstimator
	calls atomic.Int64
}

func (e *countingEstimator) Estimate(msg *message.Message) cost.Charge {
	e.calls.Add(1)
	return e.ChargeEstimator.Estimate(msg)
}

// Issue 13, item 8: payloads of any size up to cost.MaxPayloadBytes were
// admitted (the charge clamped to the capacity) and decoded alone. Above
// MaxPayloadBytes the message is refused before it is priced: OnOversize
// (WithOnOversize) takes it, or the error wraps ErrOversize and cost.ErrTooLarge, which the
// retry gate dead-letters.
func TestEdgeBudgetPayloadCap(t *testing.T) {
	est := &countingEstimator{ChargeEstimator: cost.NewEstimator(cost.FullBudget, cost.WithComputeMissing())}
	var refused []Admission
	var ran atomic.Int64
	h := func(*message.Message) ([]*message.Message, error) { ran.Add(1); return nil, nil }
	b := mustVertexBudget(1_000)
	mw := newAdmitter(t, b, WithEstimator(est), WithMaxPayloadBytes(1<<10))

	big := message.NewMessage("big", bytes.Repeat([]byte(" "), 1<<10+1))
	_, err := mw.Middleware(h)(big)
	if !errors.Is(err, ErrOversize) || !errors.Is(err, cost.ErrTooLarge) || !retrygate.IsPermanent(err) {
		t.Errorf("over the cap: err = %v, want ErrOversize, permanent", err)
	}
	if ran.Load() != 0 || est.calls.Load() != 0 {
		t.Errorf("over the cap: handler ran %d times, estimator %d; want neither", ran.Load(), est.calls.Load())
	}

	mw = newAdmitter(t, b, WithEstimator(est), WithMaxPayloadBytes(1<<10),
		WithOnOversize(func(_ *message.Message, a Admission) error { refused = append(refused, a); return nil }))
	if out, err := mw.Middleware(h)(big); err != nil || out != nil {
		t.Errorf("with OnOversize: %v, %v; want the message acked", out, err)
	}
	if len(refused) != 1 || refused[0].Result != Oversize || ran.Load() != 0 {
		t.Errorf("OnOversize saw %+v, handler ran %d times", refused, ran.Load())
	}
	small := message.NewMessage("small", []byte(`{"type":"Point","coordinates":[1,2]}`))
	if _, err := mw.Middleware(h)(small); err != nil || ran.Load() != 1 || est.calls.Load() != 1 {
		t.Errorf("under the cap: err %v, ran %d, priced %d times; want run once, priced once", err, ran.Load(), est.calls.Load())
	}
	if s := b.Stats(); s.InUse != 0 || s.Admitted != 1 {
		t.Errorf("budget after: %+v", s)
	}
	if _, err := New(b, WithMaxPayloadBytes(-1)); !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Errorf("negative MaxPayloadBytes: %v", err)
	}
}

// Issue 13, item 15: a message too big to finish alone inside the deadline
// was clamped and held the whole budget, and its delivery, however long it
// took. With MaxVertices set to the solo limit (here just below the
// largest real boundary the project ships, stamped as the stamping
// publisher stamps it), that message takes OnOversize's path, the others
// run.
func TestEdgeBudgetSoloLimitLargestBoundary(t *testing.T) {
	f, err := os.Open("../testdata/countries-land-10km.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	var largest []byte
	var largestN, second int
	for sc.Scan() {
		n, err := cost.CountPayload(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if n > largestN {
			largest, largestN, second = bytes.Clone(sc.Bytes()), n, largestN
		} else {
			second = max(second, n)
		}
	}
	if err := sc.Err(); err != nil || largestN == 0 {
		t.Fatalf("reading the sample: %v (%d vertices)", err, largestN)
	}
	limit := int64(largestN - 1)

	var routed []string
	var ran atomic.Int64
	mw := newAdmitter(t, mustVertexBudget(int64(largestN)), // the budget would admit it
		WithMaxVertices(limit),
		WithOnOversize(func(msg *message.Message, a Admission) error {
			routed = append(routed, msg.UUID+"="+strconv.FormatInt(a.Charge.Vertices, 10))
			return nil
		}),
	)
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { ran.Add(1); return nil, nil })
	msg := message.NewMessage("largest", largest)
	msg.Metadata.Set(cost.MetadataKey, strconv.Itoa(largestN))
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	if want := "largest=" + strconv.Itoa(largestN); len(routed) != 1 || routed[0] != want || ran.Load() != 0 {
		t.Errorf("routed %v, handler ran %d times; want [%s] and no run", routed, ran.Load(), want)
	}
	// The next largest fits: it runs.
	ok := message.NewMessage("second", []byte(`{}`))
	ok.Metadata.Set(cost.MetadataKey, strconv.Itoa(second))
	if _, err := h(ok); err != nil || ran.Load() != 1 {
		t.Errorf("second largest (%d vertices): err %v, ran %d", second, err, ran.Load())
	}
	// An unknown cost is charged the default, which is no measurement: it
	// is clamped as before, not refused.
	if _, err := h(message.NewMessage("unknown", []byte("x"))); err != nil || ran.Load() != 2 {
		t.Errorf("unknown cost: err %v, ran %d", err, ran.Load())
	}
}
