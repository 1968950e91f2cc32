package sizing_test

import (
	"math"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

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
				sizer, err := sizing.NewAutoSizer(sizing.AutoSizeConfig{
					Budget: vb, Deadline: time.Second, Window: time.Second,
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
					mw, err := middleware.NewBudget(middleware.BudgetConfig{Budget: vb})
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
