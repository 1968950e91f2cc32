package sizing_test

import (
	"fmt"
	"time"

	"github.com/spillway-go/spillway/middleware"
	"github.com/spillway-go/spillway/sizing"
)

func ExampleRecommend() {
	// Measured on a sample of the busiest hour (sizing.MeasureBytesPerVertex
	// and sizing.MeasureThroughput); the rest describes the deployment.
	in := sizing.Inputs{
		MemoryBytes:       4 << 30,   // 4 GiB container, less the processes' idle RSS
		Processes:         2,         // two consumers share it
		PrefetchBytes:     256 << 20, // each buffers up to 256 MiB ahead
		BytesPerVertex:    180,
		VerticesPerSecond: 300_000,
		Parallelism:       4,                // handlers at once when it was measured
		Deadline:          60 * time.Second, // Kafka Rebalance.Timeout
	}
	r, err := sizing.Recommend(in)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("memory bound:  ", r.MemoryBound)
	fmt.Println("deadline bound:", r.DeadlineBound)
	fmt.Println("budget:        ", r.Budget, r.Binding)
	fmt.Println("solo limit:    ", r.SoloLimit)

	// Twice the processes in the same container: each gets half the
	// memory, and memory binds.
	in.Processes = 4
	r, _ = sizing.Recommend(in)
	fmt.Println("budget:        ", r.Budget, r.Binding)

	// Output:
	// memory bound:   10439156
	// deadline bound: 9000000
	// budget:         9000000 deadline
	// solo limit:     2250000
	// budget:         4473924 memory
}

func ExampleNew() {
	// The budget the router's (or your) budget middleware admits against.
	budget, err := middleware.NewVertexBudget(200_000)
	if err != nil {
		fmt.Println(err)
		return
	}
	sizer, err := sizing.New(budget, sizing.Config{
		Deadline:    60 * time.Second, // Kafka Rebalance.Timeout
		MemoryBound: 4_000_000,        // from sizing.Recommend, fixed
		Floor:       10_000,
	}, sizing.WithOnResize(func(from, to int64, b sizing.Bounds) {
		fmt.Printf("budget %d -> %d vertices, %s binds\n", from, to, b.Binding)
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	// Add sizer.Middleware inside the budget middleware (after it), so it
	// times the handler's work and not the wait for budget. Until
	// MinWindows windows were measured, it wants nothing.
	fmt.Println(sizer.Bounds().Budget)

	// Output:
	// 0
}
