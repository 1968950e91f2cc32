package sizing_test

import (
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/sizing"
)

// Issue 13, item 7: a forged vertex_count (math.MaxInt64) fed the raw
// header to the auto-sizer, whose window sum overflowed: the budget went to
// the floor or the ceiling. The sizer measures the charge the budget
// granted, adds without overflow and ignores header counts above the
// capacity, so honest traffic alone sets the throughput, behind a budget
// middleware and without one.
func TestEdgeAutoSizerForgedVertexCount(t *testing.T) {
	for _, withBudget := range []bool{true, false} {
		t.Run("budget="+strconv.FormatBool(withBudget), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				vb := mustVertexBudget(20_000)
				sizer, err := sizing.New(vb, sizing.Config{
					Deadline: time.Second, Window: time.Second,
					Windows: 3, MinWindows: 3, Parallelism: 1, Ceiling: 1 << 30, TailShare: -1,
				})
				if err != nil {
					t.Fatal(err)
				}
				// 100 vertices a millisecond: 100k vertices/s, a deadline
				// bound of 50k at the default headroom.
				h := sizer.Middleware(func(msg *message.Message) ([]*message.Message, error) {
					time.Sleep(time.Millisecond)
					return nil, nil
				})
				if withBudget {
					mw, err := middleware.New(vb)
					if err != nil {
						t.Fatal(err)
					}
					h = mw.Middleware(h)
				}
				end := time.Now().Add(5 * time.Second)
				for i := 0; time.Now().Before(end); i++ {
					msg := message.NewMessage(watermill.NewUUID(), []byte("{}"))
					msg.Metadata.Set("vertex_count", "100")
					if i%333 == 0 {
						msg.Metadata.Set("vertex_count", strconv.FormatInt(math.MaxInt64, 10))
					}
					if _, err := h(msg); err != nil {
						t.Fatal(err)
					}
				}
				b := sizer.Bounds()
				if b.VerticesPerSecond < 95_000 || b.VerticesPerSecond > 100_001 {
					t.Errorf("measured %.0f vertices/s, want about 100k", b.VerticesPerSecond)
				}
				if c := vb.Capacity(); c < 45_000 || c > 55_000 {
					t.Errorf("capacity %d, want the deadline bound of about 50k; bounds %+v", c, b)
				}
			})
		})
	}
}

// Issue 13, item 15: the deadline bound assumes admitted work runs in
// parallel, but one message runs on one core. With the largest real
// boundary the project ships (countries-land-10km) and a throughput whose
// budget admits it, one core takes longer than the deadline's headroom on
// it: Recommend reports a solo limit below the sample's largest message
// (spillway size warns about it).
func TestEdgeRecommendSoloLimit(t *testing.T) {
	s := loadSample(t, countriesFile, nil)
	largest := int64(0)
	for _, v := range s.Vertices {
		largest = max(largest, int64(v))
	}
	if largest < 5_000 {
		t.Fatalf("largest boundary has %d vertices: the sample changed", largest)
	}
	// Two cores at 2 × largest vertices/s together: the budget (a full
	// second's headroom of 0.5 s) holds the largest message, but one core
	// alone needs a whole second for it.
	in := sizing.Inputs{
		MemoryBytes: 1 << 30, BytesPerVertex: 100,
		VerticesPerSecond: float64(2 * largest), Parallelism: 2,
		Deadline: time.Second, Headroom: 0.5,
	}
	r, err := sizing.Recommend(in)
	if err != nil {
		t.Fatal(err)
	}
	if r.Budget < largest {
		t.Fatalf("budget %d below the largest message %d: the case is not the one tested", r.Budget, largest)
	}
	if want := largest / 2; r.SoloLimit != want {
		t.Errorf("SoloLimit = %d, want one core's half second: %d", r.SoloLimit, want)
	}

	// On four times the throughput the largest boundary finishes alone in
	// time.
	in.VerticesPerSecond *= 4
	if r, err = sizing.Recommend(in); err != nil || r.SoloLimit < largest {
		t.Errorf("4× faster: solo limit %d, err %v; want at least the largest message, %d", r.SoloLimit, err, largest)
	}
	in.Parallelism = -1
	if _, err := sizing.Recommend(in); err == nil {
		t.Error("negative parallelism accepted")
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

// Issue 13, item 8: behind a budget middleware the auto-sizer priced every
// message a second time (with compute_missing, a second full parse). It
// reads the charge the budget granted: one pricing per message. The
// messages carry no vertex_count, so only the budget's count (a computed
// charge) can have taught the sizer their size.
func TestEdgeAutoSizerPricesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		est := &countingEstimator{ChargeEstimator: cost.NewEstimator(cost.FullBudget, cost.WithComputeMissing())}
		vb := mustVertexBudget(1_000)
		sizer, err := sizing.New(vb, sizing.Config{Deadline: time.Second, Window: time.Second, Parallelism: 1})
		if err != nil {
			t.Fatal(err)
		}
		mw, err := middleware.New(vb, middleware.WithEstimator(est))
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Middleware(sizer.Middleware(func(*message.Message) ([]*message.Message, error) {
			time.Sleep(100 * time.Millisecond)
			return nil, nil
		}))
		for i := range 20 {
			msg := message.NewMessage(strconv.Itoa(i), []byte(`{"type":"LineString","coordinates":[[0,0],[1,1]]}`))
			if _, err := h(msg); err != nil {
				t.Fatal(err)
			}
		}
		if n := est.calls.Load(); n != 20 {
			t.Errorf("20 messages priced %d times, want 20", n)
		}
		// 2 vertices in 100 ms: 20 vertices/s.
		if b := sizer.Bounds(); math.Abs(b.VerticesPerSecond-20) > 1e-6 {
			t.Errorf("measured %.3f vertices/s, want 20 from the admitted charges", b.VerticesPerSecond)
		}
	})
}
