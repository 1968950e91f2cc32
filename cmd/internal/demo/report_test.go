package demo

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// syntheticRecording is a small recording shaped like a real run, made up
// without Kafka: the plain group falls over mid-burst, Spillway holds.
func syntheticRecording() *Recording {
	o := DefaultOptions().withDefaults()
	o.Duration, o.BurstAt = 20*time.Second, 5*time.Second
	r := &Recording{
		Started: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Machine: Machine{GOOS: "linux", GOARCH: "amd64", CPUs: 2, GOMAXPROCS: 2, Go: "go1.26"},
		Options: o,
		Stream:  StreamInfo{Messages: 4400, Pings: 4000, Parcels: 388, Heavies: 12, Vertices: 260_000, HeavyVertices: 240_000},
		Calibration: Calibration{Cores: 2, HeavyVertices: 20_000, Passes: 90, HeavySeconds: 1.33, VerticesPerSecond: 30_000,
			BytesPerVertex: 150, MemoryBytes: 96 << 20, MemoryBound: 600_000, DeadlineBound: 60_000, Budget: 60_000,
			Binding: "deadline"},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for gi, name := range []string{GroupNaive, GroupSpillway} {
		g := &GroupRecording{Name: name, Description: groupDescriptions[name], Members: 2, Published: 4400,
			JoinedAt: 6, Noticed: 6.3, Rebalance: 1.2, Drained: 24, Ended: 24}
		for i := range 150 {
			t := float64(i) * 0.2
			s := Sample{T: t, Heap: uint64(40+10*math.Sin(t)) << 20, Lag: int64(100 + 50*math.Sin(t/3)), Members: 1}
			burst := t >= 5 && t < 15
			switch {
			case name == GroupNaive && burst:
				s.Inflight, s.Heap = 240_000, s.Heap+60<<20
			case burst:
				s.Inflight, s.Budget = 40_000+int64(rng.IntN(20_000)), 60_000
			case name == GroupSpillway:
				s.Budget = 60_000
			}
			g.Series = append(g.Series, s)
		}
		for i := range 4000 {
			t := rng.Float64() * 24
			lat := 0.005 + rng.ExpFloat64()*0.02
			if t > 5 && t < 15 {
				lat *= float64(10 * (gi + 1))
			}
			g.Latencies = append(g.Latencies, Latency{T: t, Seconds: lat, Kind: Kind(i % 3)})
		}
		g.Events = []Event{{5, "burst: 12 heavy multipolygons published"}, {6, "second consumer joins: rebalance"}}
		g.Unique, g.Accounted, g.Retries = 4400, 4400, 40
		if name == GroupNaive {
			g.Duplicates, g.DupVertices, g.Redeliveries, g.Evictions, g.Rebalance = 12, 240_000, 25, 1, 9.5
			g.Drained, g.Accounted = -1, 4100
			g.Unfinished = []Latency{{T: 24, Seconds: 15, Kind: KindParcel}}
		} else {
			g.Shed = 20
		}
		r.Groups = append(r.Groups, g)
	}
	return r
}

func writeSyntheticReport(t *testing.T) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteReport(&buf, syntheticRecording()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "demo-report.html")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, buf.String()
}

func TestReportIsSelfContained(t *testing.T) {
	_, html := writeSyntheticReport(t)
	if n := strings.Count(html, "<svg "); n != len(ChartTitles) {
		t.Errorf("%d <svg> elements, want %d", n, len(ChartTitles))
	}
	for _, title := range ChartTitles {
		if !strings.Contains(html, "<h2>"+title+"</h2>") {
			t.Errorf("no heading %q", title)
		}
	}
	// Nothing is fetched: no scripts, stylesheets, images or fonts from
	// anywhere. (The SVG namespace URIs are names, not fetches.)
	for _, re := range []string{`<script`, `<link`, `<img`, `<iframe`, `@import`, `url\(`, `src=`, `href=`} {
		if m := regexp.MustCompile(`(?i)` + re).FindString(html); m != "" {
			t.Errorf("report loads something: found %q", m)
		}
	}
	if strings.Contains(html, "<?xml") {
		t.Error("an XML prolog was left inside the HTML")
	}
	for _, want := range []string{"naive fell over", "spillway held", "messages processed twice"} {
		if !strings.Contains(html, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

func TestSummaryOfSyntheticRecording(t *testing.T) {
	s := syntheticRecording().Summarize()
	if len(s.Groups) != 2 {
		t.Fatalf("%d groups", len(s.Groups))
	}
	naive, sp := s.Groups[0], s.Groups[1]
	if !naive.Failed() || sp.Failed() {
		t.Errorf("failed: naive %v, spillway %v", naive.Failed(), sp.Failed())
	}
	if naive.Unprocessed != 300 || naive.DrainSeconds != -1 {
		t.Errorf("naive: %d unprocessed, drained %v", naive.Unprocessed, naive.DrainSeconds)
	}
	if sp.StartBudget != 60_000 || sp.MaxInflightVertices < 40_000 || sp.MaxInflightVertices > 60_000 {
		t.Errorf("spillway: budget %d, max in flight %d", sp.StartBudget, sp.MaxInflightVertices)
	}
	// The unfinished message counts in the latency with its age.
	if naive.LatencyMax != 15 {
		t.Errorf("naive max latency %v, want the unfinished message's 15s", naive.LatencyMax)
	}
	var buf bytes.Buffer
	if err := s.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"duplicates (work done twice)", "9.5s LATE", "never", "24.0s"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestReportInChromium loads the report in a headless Chromium and checks
// that the charts are in the rendered DOM. It is skipped where chromium is
// not installed, unless SPILLWAY_REQUIRE_CHROMIUM=1 (CI).
func TestReportInChromium(t *testing.T) {
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		if os.Getenv("SPILLWAY_REQUIRE_CHROMIUM") == "1" {
			t.Fatal("chromium is not installed and SPILLWAY_REQUIRE_CHROMIUM=1 (apt-get install chromium)")
		}
		t.Skip("chromium not installed (apt-get install chromium); set SPILLWAY_REQUIRE_CHROMIUM=1 to make this fatal")
	}
	path, _ := writeSyntheticReport(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--dump-dom", "file://"+path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	dom := string(out)
	if n := strings.Count(dom, "<svg "); n != len(ChartTitles) {
		t.Errorf("rendered DOM has %d <svg> charts, want %d", n, len(ChartTitles))
	}
	for _, title := range ChartTitles {
		if !strings.Contains(dom, `aria-label="`+title+`"`) {
			t.Errorf("rendered DOM lacks the chart %q", title)
		}
	}
	// gonum draws text as <text> elements: the chart titles are in the SVG.
	if n := strings.Count(dom, "<text"); n < 5*len(ChartTitles) {
		t.Errorf("only %d <text> elements in the charts", n)
	}
}
