package main

import (
	"io"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// progressDelay is how long measuring runs before a bar appears: quick
// measurements print nothing.
const progressDelay = time.Second

// progress is a bar over the vertices measured, drawn on stderr only when
// enabled and only once measuring has taken longer than progressDelay. The
// zero value and a disabled progress do nothing.
type progress struct {
	p     *mpb.Progress
	bar   *mpb.Bar
	timer *time.Timer
	once  sync.Once
}

func newProgress(w io.Writer, enabled bool, total int64, name string) *progress {
	if !enabled || total <= 0 {
		return &progress{}
	}
	delay := make(chan any)
	pr := &progress{}
	pr.timer = time.AfterFunc(progressDelay, func() { close(delay) })
	pr.p = mpb.New(mpb.WithOutput(w), mpb.WithAutoRefresh(), mpb.WithRenderDelay(delay), mpb.WithWidth(72))
	pr.bar = pr.p.AddBar(total,
		mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR), decor.Percentage(decor.WCSyncSpace)),
		mpb.AppendDecorators(decor.Elapsed(decor.ET_STYLE_GO, decor.WCSyncSpace)),
		mpb.BarRemoveOnComplete(),
	)
	return pr
}

// offset returns a progress callback for one measurement whose vertices
// start at base on the bar.
func (pr *progress) offset(base int64) func(done, total int64) {
	if pr.bar == nil {
		return nil
	}
	return func(done, _ int64) { pr.bar.SetCurrent(base + done) }
}

// stop completes or aborts the bar and waits for it to be cleared. It is
// safe to call more than once.
func (pr *progress) stop() {
	if pr.p == nil {
		return
	}
	pr.once.Do(func() {
		if pr.timer.Stop() {
			// Measuring was quick: nothing was drawn, and nothing will be.
			pr.bar.Abort(true)
		} else if !pr.bar.Completed() {
			pr.bar.Abort(true)
		}
		pr.p.Wait()
	})
}
