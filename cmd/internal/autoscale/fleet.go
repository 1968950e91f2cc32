package autoscale

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// proc is one worker process.
type proc struct {
	cmd     *exec.Cmd
	metrics string // URL, "" for a worker without metrics
	started time.Time
	done    chan struct{}
	exited  time.Time // once done is closed
	err     error
}

// fleet starts and stops the worker processes of one run.
type fleet struct {
	spec workerSpec // Out is set per process
	dir  string
	exe  string

	mu     sync.Mutex
	live   []*proc // serving, oldest first
	all    []*proc
	starts int
}

func newFleet(spec workerSpec, dir string) (*fleet, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("autoscale: finding this executable to run the workers: %w", err)
	}
	return &fleet{spec: spec, dir: dir, exe: exe}, nil
}

// size is the number of serving processes.
func (f *fleet) size() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

// scaleTo starts or stops processes until n serve. It stops the newest
// first, with SIGTERM: the worker closes gracefully.
func (f *fleet) scaleTo(n int) error {
	for f.size() < n {
		if err := f.startOne(); err != nil {
			return err
		}
	}
	for f.size() > n {
		f.mu.Lock()
		p := f.live[len(f.live)-1]
		f.live = f.live[:len(f.live)-1]
		f.mu.Unlock()
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	return nil
}

func (f *fleet) startOne() error {
	f.mu.Lock()
	f.starts++
	n := f.starts
	f.mu.Unlock()
	spec := f.spec
	spec.Out = filepath.Join(f.dir, fmt.Sprintf("worker-%02d.log", n))
	raw, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	errOut, err := os.Create(filepath.Join(f.dir, fmt.Sprintf("worker-%02d.err", n)))
	if err != nil {
		return err
	}
	cmd := exec.Command(f.exe)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
	cmd.Stderr = errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		errOut.Close()
		return err
	}
	p := &proc{cmd: cmd, started: time.Now(), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		errOut.Close()
		return fmt.Errorf("autoscale: starting a worker: %w", err)
	}
	go func() {
		p.err = cmd.Wait()
		p.exited = time.Now()
		errOut.Close()
		close(p.done)
	}()
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(l)
		_, _ = io.Copy(io.Discard, out)
	}()
	var first string
	select {
	case first = <-line:
	case <-time.After(30 * time.Second):
	case <-p.done:
	}
	url, ok := strings.CutPrefix(first, "ready ")
	if !ok {
		_ = cmd.Process.Kill()
		<-p.done
		msg, _ := os.ReadFile(errOut.Name())
		return fmt.Errorf("autoscale: worker %d did not start (%v): %s", n, p.err, strings.TrimSpace(string(msg)))
	}
	if url != "-" {
		p.metrics = url
	}
	f.mu.Lock()
	f.live = append(f.live, p)
	f.all = append(f.all, p)
	f.mu.Unlock()
	return nil
}

// stopAll stops every process and waits up to grace for them to exit,
// then kills the rest. It returns the workers that failed.
func (f *fleet) stopAll(grace time.Duration) []error {
	_ = f.scaleTo(0)
	f.mu.Lock()
	all := append([]*proc(nil), f.all...)
	f.mu.Unlock()
	deadline := time.After(grace)
	var errs []error
	for i, p := range all {
		select {
		case <-p.done:
		case <-deadline:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if p.err != nil {
			msg, _ := os.ReadFile(filepath.Join(f.dir, fmt.Sprintf("worker-%02d.err", i+1)))
			errs = append(errs, fmt.Errorf("worker %d: %v: %s", i+1, p.err, lastLines(string(msg), 3)))
		}
	}
	return errs
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// spans returns each process's start and end (until for one still
// running), relative to t0.
func (f *fleet) spans(t0, until time.Time) [][2]float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][2]float64
	for _, p := range f.all {
		end := until
		select {
		case <-p.done:
			if p.exited.Before(until) {
				end = p.exited
			}
		default:
		}
		out = append(out, [2]float64{p.started.Sub(t0).Seconds(), end.Sub(t0).Seconds()})
	}
	return out
}

// scrape reads the drain-time signal from the serving workers' metrics,
// as docs/scaling.md's query does: the largest spillway_backlog_vertices
// per partition (stream) of group, summed, over the average
// spillway_drain_rate_per_second of source "spillway". A worker that does
// not answer is left out.
func (f *fleet) scrape(ctx context.Context, group string) DrainSignal {
	f.mu.Lock()
	var urls []string
	for _, p := range f.live {
		if p.metrics != "" {
			urls = append(urls, p.metrics)
		}
	}
	f.mu.Unlock()
	var pages []map[string]*dto.MetricFamily
	for _, u := range urls {
		if fams, err := scrapeOne(ctx, u); err == nil {
			pages = append(pages, fams)
		}
	}
	return drainSignal(pages, group)
}

func scrapeOne(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// drainSignal evaluates the drain-time query over the pages scraped from
// the workers.
func drainSignal(pages []map[string]*dto.MetricFamily, group string) DrainSignal {
	backlog := map[[3]string]float64{}
	var s DrainSignal
	var rateSum float64
	for _, fams := range pages {
		if f := fams["spillway_backlog_vertices"]; f != nil {
			for _, m := range f.GetMetric() {
				l := labels(m)
				if l["group"] != group {
					continue
				}
				k := [3]string{l["topic"], l["group"], l["partition"]}
				backlog[k] = max(backlog[k], value(m))
			}
		}
		if f := fams["spillway_drain_rate_per_second"]; f != nil {
			for _, m := range f.GetMetric() {
				if labels(m)["source"] != "spillway" {
					continue
				}
				rateSum += value(m)
				s.Rates++
			}
		}
	}
	for _, v := range backlog {
		s.Backlog += v
	}
	if s.Rates > 0 {
		s.Rate = rateSum / float64(s.Rates)
	}
	return s
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}
