package crashtest_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/internal/crashtest"
	"github.com/spillway-go/spillway/internal/geodata"
	"github.com/spillway-go/spillway/sizing"
)

// envSoak, set to a duration, runs TestSoak for that long; make soak sets
// it (SOAK=10m by default).
const envSoak = "SPILLWAY_SOAK"

// soakBudget is the consumers' vertex budget in the soak.
const soakBudget = 10_000

// TestSoak is the soak a user can run (make soak; docs/benchmarks.md): on
// Kafka and on Redis at once, real geometry published at twice the
// consumers' measured capacity, with poison payloads and producer
// duplicates mixed in, and one of the two consumer processes killed
// (kill -9) and restarted with the same identity every minute. At the end
// the consumers are stopped with SIGTERM, a fast consumer drains what is
// left, and the accounting must close: every message published is
// processed (during the soak, or drained after it: in flight at stop) or
// dead-lettered, and every duplicate has a cause.
func TestSoak(t *testing.T) {
	v := os.Getenv(envSoak)
	if v == "" {
		t.Skipf("set %s to a duration to run the soak (make soak)", envSoak)
	}
	dur, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", envSoak, v, err)
	}
	var feats []geodata.Feature
	for _, name := range []string{geodata.Countries, geodata.Counties} {
		f, err := geodata.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		feats = append(feats, f...)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(feats), func(i, j int) { feats[i], feats[j] = feats[j], feats[i] })
	payloads := make([][]byte, 0, 400)
	for _, f := range feats[:400] {
		payloads = append(payloads, f.Geometry)
	}
	sample, err := sizing.NewSample(payloads)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := sizing.MeasureBytesPerVertex(sample)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			cfg := strings.Replace(b.cfg(t), "vertices: 1000", fmt.Sprintf("vertices: %d", soakBudget), 1) + retrySection
			soak(t, b.name, cfg, feats, dur, mem.BytesPerVertex)
		})
	}
}

type soakRun struct {
	t        *testing.T
	cfg      string
	pub      message.Publisher
	raw      message.Publisher
	feats    []geodata.Feature
	next     int
	ids      []string        // every id published, once
	poison   map[string]bool // ids published as poison
	dupes    map[string]bool // ids published twice on purpose
	vertices map[string]int  // id → vertices
	workers  []*crashtest.Consumer
	killed   []*crashtest.Consumer
	all      []*crashtest.Consumer
	opts     [2]crashtest.Options
	// send publishes one message: at once during calibration, through a
	// pool of publishing goroutines during the soak.
	send func(p message.Publisher, m *message.Message)
}

// soakPublishers is how many goroutines publish during the soak: one
// publisher sending one message at a time cannot reach twice a consumer
// pair's capacity on Redis.
const soakPublishers = 16

// drainStall is how long the drain after the soak may go without one more
// message processed or dead-lettered before the test stops waiting.
const drainStall = 2 * time.Minute

func (s *soakRun) publish(n int) (vertices int) {
	s.t.Helper()
	for range n {
		f := s.feats[s.next%len(s.feats)]
		id := fmt.Sprintf("s%07d", s.next)
		s.next++
		switch {
		case s.next%100 == 0:
			id = "poison-" + id
			s.send(s.raw, message.NewMessage(id, []byte("garbage")))
			s.poison[id] = true
		default:
			s.send(s.pub, message.NewMessage(id, []byte(f.Geometry)))
			s.vertices[id] = f.Vertices
			vertices += f.Vertices
			if s.next%150 == 0 {
				// The producer sends it again (a retried send, say).
				s.send(s.pub, message.NewMessage(id, []byte(f.Geometry)))
				s.dupes[id] = true
			}
		}
		s.ids = append(s.ids, id)
	}
	return vertices
}

func (s *soakRun) doneAll(extra ...*crashtest.Consumer) map[string]int {
	done := map[string]int{}
	for _, c := range append(append([]*crashtest.Consumer(nil), s.all...), extra...) {
		for id, k := range c.Journal().Done {
			done[id] += k
		}
	}
	return done
}

func soak(t *testing.T, name, cfg string, feats []geodata.Feature, dur time.Duration, bytesPerVertex float64) {
	c := loadConfig(t, cfg)
	s := &soakRun{t: t, cfg: cfg, feats: feats, poison: map[string]bool{}, dupes: map[string]bool{}, vertices: map[string]int{}}
	s.raw = rawPublisher(t, c)
	s.send = func(p message.Publisher, m *message.Message) {
		if err := p.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
	}
	s.pub = stampingPublisher(t, cfg)
	dlq := collect(t, cfg, "soak-dlq", topic+".dead_letter")
	for i := range s.opts {
		s.opts[i] = crashtest.Options{Config: cfg, Topic: topic, PerVertex: 50 * time.Microsecond, Decode: true,
			Env: []string{fmt.Sprintf("SPILLWAY_REDIS_CONSUMER=soak-%d", i)}}
	}

	// Capacity: how fast two consumers drain a backlog of the mix.
	// The clock starts once both consumers run, so their start-up is not
	// counted against them.
	backlog := s.publish(1000)
	var start time.Time
	for i := range s.opts {
		w := crashtest.Start(t, s.opts[i])
		s.workers = append(s.workers, w)
		s.all = append(s.all, w)
		if i == 0 {
			start = time.Now()
		}
	}
	for {
		done := s.doneAll()
		n := 0
		for _, id := range s.ids {
			if done[id] > 0 || s.poison[id] {
				n++
			}
		}
		if n == len(s.ids) {
			break
		}
		if time.Since(start) > 5*time.Minute {
			t.Fatalf("calibration: %d of %d messages after 5 minutes", n, len(s.ids))
		}
		time.Sleep(100 * time.Millisecond)
	}
	capacity := float64(backlog) / time.Since(start).Seconds()
	target := 2 * capacity
	t.Logf("%s: capacity %.0f vertices/s (a backlog of %d vertices in %s); publishing at %.0f vertices/s for %s",
		name, capacity, backlog, time.Since(start).Round(time.Millisecond), target, dur)

	// The soak: publish at twice the capacity; kill and restart one
	// consumer every minute.
	jobs := make(chan func() error, 1024)
	var pool sync.WaitGroup
	var pubErrs atomic.Int64
	for range soakPublishers {
		pool.Add(1)
		go func() {
			defer pool.Done()
			for job := range jobs {
				if err := job(); err != nil && pubErrs.Add(1) == 1 {
					t.Errorf("publishing: %v", err)
				}
			}
		}()
	}
	s.send = func(p message.Publisher, m *message.Message) {
		jobs <- func() error { return p.Publish(topic, m) }
	}
	start = time.Now()
	published := 0 // vertices
	nextKill := start.Add(time.Minute)
	kills := 0
	for time.Since(start) < dur {
		if time.Now().After(nextKill) {
			i := kills % len(s.workers)
			victim := s.workers[i]
			victim.Kill()
			s.killed = append(s.killed, victim)
			opts := s.opts[i]
			opts.Journal = fmt.Sprintf("%s.%d", victim.JournalPath(), kills+1)
			w := crashtest.Start(t, opts)
			s.workers[i] = w
			s.all = append(s.all, w)
			kills++
			nextKill = nextKill.Add(time.Minute)
		}
		due := target * time.Since(start).Seconds()
		if float64(published) < due {
			published += s.publish(1)
			continue
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(jobs)
	pool.Wait()
	elapsed := time.Since(start)

	// Stop: SIGTERM, then drain what is left with a consumer that only
	// decodes.
	duringSoak := s.doneAll()
	for _, w := range s.workers {
		if err := w.Terminate(time.Minute); err != nil {
			t.Errorf("SIGTERM: %v", err)
		}
	}
	stopped := s.doneAll()
	drainOpts := s.opts[0]
	drainOpts.PerVertex = 0
	drainOpts.Journal = ""
	drainOpts.Env = []string{"SPILLWAY_REDIS_CONSUMER=soak-drain"}
	drain := crashtest.Start(t, drainOpts)
	// The drain waits as long as it makes progress: at twice the capacity
	// the backlog at stop is about as long as the soak itself, and how
	// fast it drains depends on the machine. It gives up when nothing has
	// moved for drainStall, and the accounting then says what is left.
	// Only the drain's own journal changes now, so only it is re-read.
	// open counts the records of each id not processed yet (a message
	// sent twice is two records); poison is open until dead-lettered.
	open := map[string]int{}
	for _, id := range s.ids {
		want := 1
		if s.dupes[id] {
			want = 2
		}
		if n := want - stopped[id]; n > 0 || s.poison[id] {
			open[id] = max(n, 1)
		}
	}
	var drained map[string]int
	var dead map[string]int
	drainStart, lastMove := time.Now(), time.Now()
	for {
		drained, dead = drain.Journal().Done, dlq.snapshot()
		before := len(open)
		for id, n := range open {
			if (s.poison[id] && dead[id] > 0) || (!s.poison[id] && drained[id] >= n) {
				delete(open, id)
			}
		}
		if len(open) < before {
			lastMove = time.Now()
		}
		if len(open) == 0 || time.Since(lastMove) > drainStall {
			break
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("%s: drain took %s; %d messages still open", name, time.Since(drainStart).Round(time.Second), len(open))
	done := maps.Clone(stopped)
	for id, k := range drained {
		done[id] += k
	}

	// The accounting.
	startedByKilled := map[string]bool{}
	for _, k := range s.killed {
		for id := range k.Journal().Started {
			startedByKilled[id] = true
		}
	}
	var processed, inFlight, deadLettered, lost, poisonProcessed int
	causes := map[string]int{}
	var unexplained []string
	for _, id := range s.ids {
		switch {
		case s.poison[id]:
			if dead[id] > 0 {
				deadLettered++
			} else {
				lost++
				unexplained = append(unexplained, id+" (poison, not dead-lettered)")
			}
			if done[id] > 0 {
				poisonProcessed++
			}
			continue
		case done[id] == 0:
			lost++
			unexplained = append(unexplained, id+" (never processed)")
			continue
		case stopped[id] > 0:
			processed++
		default:
			inFlight++
		}
		// A message sent twice is two records: each must be processed.
		want := 1
		if s.dupes[id] {
			want = 2
			if done[id] >= 2 {
				causes["sent twice by the producer"]++
			}
		}
		switch extra := done[id] - want; {
		case extra < 0:
			unexplained = append(unexplained, fmt.Sprintf("%s (sent twice, processed %d times)", id, done[id]))
		case extra > 0 && startedByKilled[id]:
			causes["started by a killed consumer"] += extra
		case extra > 0:
			unexplained = append(unexplained, fmt.Sprintf("%s (processed %d times)", id, done[id]))
		}
	}
	var peak uint64
	for _, w := range s.all {
		peak = max(peak, w.Journal().PeakHeap)
	}
	bound := float64(soakBudget) * bytesPerVertex
	var b strings.Builder
	fmt.Fprintf(&b, "soak on %s, %s, target %.0f vertices/s (2 × capacity %.0f), published %.0f vertices/s, %d kills:\n",
		name, elapsed.Round(time.Second), target, capacity, float64(published)/elapsed.Seconds(), kills)
	fmt.Fprintf(&b, "  published      %7d (%d poison, %d sent twice)\n", len(s.ids), len(s.poison), len(s.dupes))
	fmt.Fprintf(&b, "  processed      %7d (by the workers, before they stopped; %d during the soak)\n", processed, len(duringSoak))
	fmt.Fprintf(&b, "  in flight      %7d (left in the broker at stop, drained after)\n", inFlight)
	fmt.Fprintf(&b, "  dead-lettered  %7d\n", deadLettered)
	fmt.Fprintf(&b, "  shed           %7d (no sheddable topic configured)\n", 0)
	fmt.Fprintf(&b, "  superseded     %7d (no coalescing configured)\n", 0)
	fmt.Fprintf(&b, "  unaccounted    %7d\n", lost)
	keys := make([]string, 0, len(causes))
	for k := range causes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  duplicates     %7d %s\n", causes[k], k)
	}
	fmt.Fprintf(&b, "  peak heap      %7.1f MiB in a consumer process (all of its heap); in-flight geometry bound %.1f MiB (%d vertices × %.0f B/vertex)\n",
		float64(peak)/(1<<20), bound/(1<<20), soakBudget, bytesPerVertex)
	t.Log("\n" + b.String())
	if processed+inFlight+deadLettered+lost != len(s.ids) {
		t.Errorf("accounting does not close: %d + %d + %d + %d != %d", processed, inFlight, deadLettered, lost, len(s.ids))
	}
	if len(unexplained) > 0 {
		sort.Strings(unexplained)
		t.Errorf("%d unexplained: %v", len(unexplained), unexplained[:min(20, len(unexplained))])
	}
	if poisonProcessed > 0 {
		t.Errorf("%d poison payloads processed", poisonProcessed)
	}
}
