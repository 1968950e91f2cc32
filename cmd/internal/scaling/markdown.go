package scaling

import (
	"fmt"
	"io"
	"strings"

	"github.com/spillway-go/spillway/cmd/internal/demo"
)

// WriteMarkdown writes the report as a Markdown table: one row per cell,
// the bare subscriber's figures beside Spillway's at every budget (joined
// by " / " in the budgets' order), then the verdict.
// Peak heap and measured messages are shown for the first budget.
func (rep *Report) WriteMarkdown(w io.Writer) error {
	ew := &errWriter{w: w}
	budgets := rep.Options.Budgets
	names := make([]string, len(budgets))
	for i, b := range budgets {
		names[i] = demo.Compact(float64(b))
	}
	first := "-"
	if len(names) > 0 {
		first = names[0]
	}
	per := " (" + strings.Join(names, " / ") + ")"
	fmt.Fprintf(ew, "| broker | par | handlers | cost | bare msg/s | bare CPU µs/msg | Spillway CPU µs/msg%s | CPU ratio%s | msg/s ratio%s | peak heap bare / Spillway %s (MiB) | measured bare / Spillway %s |\n",
		per, per, per, first, first)
	fmt.Fprintln(ew, "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

	type key struct {
		broker        string
		par, handlers int
		cost          string
	}
	var order []key
	cells := map[key]map[string]Result{} // "bare" or the budget's name
	for _, r := range rep.Results {
		k := key{r.Broker, r.Parallelism, r.Handlers, r.Cost}
		if cells[k] == nil {
			cells[k] = map[string]Result{}
			order = append(order, k)
		}
		who := ConsumerBare
		if r.Consumer == ConsumerSpillway {
			who = demo.Compact(float64(r.Budget))
		}
		cells[k][who] = r
	}
	join := func(c map[string]Result, f func(Result) string) string {
		parts := make([]string, len(names))
		for i, n := range names {
			parts[i] = "-"
			if r, ok := c[n]; ok {
				parts[i] = f(r)
			}
		}
		return strings.Join(parts, " / ")
	}
	for _, k := range order {
		c := cells[k]
		bare, hasBare := c[ConsumerBare]
		bareTput, bareCPU, bareHeap, bareN := "-", "-", "-", "-"
		if hasBare {
			bareTput = demo.Compact(bare.MessagesPerSecond)
			bareCPU = fmt.Sprintf("%.0f", bare.CPUPerMessage)
			bareHeap = fmt.Sprintf("%.0f", float64(bare.PeakHeapBytes)/(1<<20))
			bareN = fmt.Sprint(bare.Messages)
		}
		heap, n := "-", "-"
		if r, ok := c[first]; ok {
			heap = fmt.Sprintf("%.0f", float64(r.PeakHeapBytes)/(1<<20))
			n = fmt.Sprint(r.Messages)
		}
		ratio := func(v float64) string {
			if v <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", v)
		}
		fmt.Fprintf(ew, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s / %s | %s / %s |\n",
			k.broker, k.par, k.handlers, k.cost, bareTput, bareCPU,
			join(c, func(r Result) string { return fmt.Sprintf("%.0f", r.CPUPerMessage) }),
			join(c, func(r Result) string { return ratio(r.CPURatio) }),
			join(c, func(r Result) string { return ratio(r.ThroughputRatio) }),
			bareHeap, heap, bareN, n)
	}
	fmt.Fprintf(ew, "\n%s\n", rep.Verdict)
	return ew.err
}
