package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/spillway-go/spillway/cmd/internal/redisproc"
	"github.com/spillway-go/spillway/redisbroker"
)

// The backlogs the lag tests publish: a few heavy messages among many
// light ones, each with its vertex_count.
const (
	lagLight = 10
	lagHeavy = 5000
)

// lagJSON runs "spillway lag" with --json and decodes what it printed.
func lagJSON(t *testing.T, args ...string) lagReport {
	t.Helper()
	code, stdout, stderr := runCLI(t, append([]string{"lag", "--json"}, args...)...)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	var rep lagReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("decoding %q: %v", stdout, err)
	}
	return rep
}

// lagKafka is a kfake broker that records the requests it serves while
// recording is on.
type lagKafka struct {
	cluster *kfake.Cluster
	client  sarama.Client

	mu        sync.Mutex
	recording bool
	keys      []int16
}

// startLagKafka starts a broker with topic parcels of two partitions,
// which, as a Kafka cluster does by default, creates topics a metadata
// request names.
func startLagKafka(t *testing.T) *lagKafka {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.SeedTopics(2, "parcels"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	k := &lagKafka{cluster: c}
	c.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		k.mu.Lock()
		if k.recording {
			k.keys = append(k.keys, req.Key())
		}
		k.mu.Unlock()
		return nil, nil, false
	})
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_3_0_0
	sc.Producer.Return.Successes = true
	sc.Producer.Partitioner = sarama.NewManualPartitioner
	sc.Metadata.AllowAutoTopicCreation = false
	if k.client, err = sarama.NewClient(c.ListenAddrs(), sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.client.Close() })
	return k
}

// publish appends messages with the vertex counts given to a partition of
// parcels and returns their sum.
func (k *lagKafka) publish(t *testing.T, partition int32, counts []int64) int64 {
	t.Helper()
	p, err := sarama.NewSyncProducerFromClient(k.client)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	msgs := make([]*sarama.ProducerMessage, len(counts))
	var sum int64
	for i, n := range counts {
		sum += n
		msgs[i] = &sarama.ProducerMessage{Topic: "parcels", Partition: partition,
			Value:   sarama.ByteEncoder(strings.Repeat("x", 20)),
			Headers: []sarama.RecordHeader{{Key: []byte("vertex_count"), Value: []byte(strconv.FormatInt(n, 10))}}}
	}
	if err := p.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
	return sum
}

// commit commits offset for group on a partition of parcels, as a
// consumer that has finished the messages before it would: a member
// joins, commits and leaves.
func (k *lagKafka) commit(t *testing.T, group string, partition int32, offset int64) {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_3_0_0
	sc.Consumer.Offsets.AutoCommit.Enable = false
	cg, err := sarama.NewConsumerGroup(k.cluster.ListenAddrs(), group, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := &committer{partition: partition, offset: offset, done: make(chan struct{})}
	errc := make(chan error, 1)
	go func() { errc <- cg.Consume(ctx, []string{"parcels"}, h) }()
	select {
	case <-h.done:
	case err := <-errc:
		t.Fatalf("consumer group: %v", err)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// committer commits one offset as its session starts.
type committer struct {
	partition int32
	offset    int64
	done      chan struct{}
}

func (c *committer) Setup(s sarama.ConsumerGroupSession) error {
	s.MarkOffset("parcels", c.partition, c.offset, "")
	s.Commit()
	close(c.done)
	return nil
}

func (*committer) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (*committer) ConsumeClaim(s sarama.ConsumerGroupSession, _ sarama.ConsumerGroupClaim) error {
	<-s.Context().Done()
	return nil
}

// state is what a consumer group and the cluster hold: the group's
// committed offsets on parcels, its members, and the topics.
func (k *lagKafka) state(t *testing.T, group string) string {
	t.Helper()
	admin, err := sarama.NewClusterAdminFromClient(k.client)
	if err != nil {
		t.Fatal(err)
	}
	// The admin shares the client, which Cleanup closes.
	offsets, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{"parcels": {0, 1}})
	if err != nil {
		t.Fatalf("offsets: %v", err)
	}
	var b strings.Builder
	for p := range int32(2) {
		blk := offsets.GetBlock("parcels", p)
		fmt.Fprintf(&b, "committed %d: %d; ", p, blk.Offset)
	}
	groups, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		t.Fatalf("describe: %v", err)
	}
	for _, g := range groups {
		fmt.Fprintf(&b, "group %s %s, %d members; ", g.GroupId, g.State, len(g.Members))
	}
	topics, err := admin.ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(topics))
	for name := range topics {
		names = append(names, name)
	}
	slices.Sort(names)
	fmt.Fprintf(&b, "topics %v", names)
	return b.String()
}

func (k *lagKafka) record(on bool) {
	k.mu.Lock()
	k.recording = on
	k.mu.Unlock()
}

// groupRequests returns the names of the requests recorded that join,
// leave or change a group, commit, or create topics.
func (k *lagKafka) groupRequests() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, key := range k.keys {
		switch kmsg.Key(key) {
		case kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.LeaveGroup, kmsg.OffsetCommit,
			kmsg.TxnOffsetCommit, kmsg.CreateTopics, kmsg.DeleteGroups, kmsg.OffsetDelete:
			out = append(out, kmsg.NameForKey(key))
		}
	}
	return out
}

func (k *lagKafka) config(t *testing.T, consumer string) string {
	return writeFile(t, "spillway.yaml", fmt.Sprintf("broker: kafka\nkafka:\n  brokers: [%s]\n  version: 2.3.0\n  consumer: %s\n",
		k.cluster.ListenAddrs()[0], consumer))
}

// counts returns n light counts with a heavy one at each index of heavy.
func counts(n int, heavy ...int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = lagLight
	}
	for _, i := range heavy {
		out[i] = lagHeavy
	}
	return out
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

// TestLagKafka: per partition the messages after the committed offset (or
// all, on a partition never committed) and their vertices within 25 %,
// drain times at --drain-rate, the processes for --target; and reading
// it sends the broker no request that joins or leaves the group, commits
// or creates a topic (the broker records every request), and leaves the
// committed offsets, the group and the topics as they were.
func TestLagKafka(t *testing.T) {
	clearSpillwayEnv(t)
	k := startLagKafka(t)
	// Partition 0: 20 messages consumed and committed, then 100 light
	// messages with 3 heavy ones among them. Partition 1, never
	// committed: 150 light and one heavy of 500.
	k.publish(t, 0, counts(20))
	want0 := k.publish(t, 0, counts(103, 10, 50, 90))
	k.commit(t, "spillway.parcels", 0, 20)
	p1 := counts(151)
	p1[75] = 500
	want1 := k.publish(t, 1, p1)
	cfg := k.config(t, "partition")

	before := k.state(t, "spillway.parcels")
	k.record(true)
	rep := lagJSON(t, cfg, "--handler", "parcels=parcels", "--drain-rate", "1000", "--target", "20s")
	k.record(false)
	if reqs := k.groupRequests(); len(reqs) > 0 {
		t.Errorf("spillway lag sent %v", reqs)
	}
	if after := k.state(t, "spillway.parcels"); after != before {
		t.Errorf("state before: %s\nafter: %s", before, after)
	}

	// A topic that does not exist is an error, and stays absent although
	// the broker creates topics that metadata requests name.
	code, _, stderr := runCLI(t, "lag", cfg, "--handler", "parcels=nothere")
	if code != exitFailure || !strings.Contains(stderr, `"nothere"`) {
		t.Errorf("missing topic: exit %d, stderr %q", code, stderr)
	}
	if after := k.state(t, "spillway.parcels"); after != before {
		t.Errorf("state before: %s\nafter a missing topic: %s", before, after)
	}

	if len(rep.Groups) != 1 {
		t.Fatalf("groups %+v", rep.Groups)
	}
	g := rep.Groups[0]
	if g.Handler != "parcels" || g.Group != "spillway.parcels" || g.Topic != "parcels" || len(g.Partitions) != 2 {
		t.Fatalf("group %+v", g)
	}
	for i, want := range []struct {
		messages, vertices int64
	}{{103, want0}, {151, want1}} {
		p := g.Partitions[i]
		if p.Partition != int32(i) || p.Messages != want.messages {
			t.Errorf("partition %d: %+v, want partition %d with %d messages", i, p, i, want.messages)
		}
		if e := float64(p.Vertices-want.vertices) / float64(want.vertices); math.Abs(e) > 0.25 {
			t.Errorf("partition %d: %d vertices estimated, %d true: error %+.0f%%", i, p.Vertices, want.vertices, 100*e)
		}
		if p.Seconds == nil || math.Abs(*p.Seconds-float64(p.Vertices)/1000) > 1e-9 {
			t.Errorf("partition %d: drain %v s for %d vertices at 1000/s", i, p.Seconds, p.Vertices)
		}
	}
	if g.Messages != 254 || g.Vertices != g.Partitions[0].Vertices+g.Partitions[1].Vertices {
		t.Errorf("group totals %d messages, %d vertices", g.Messages, g.Vertices)
	}
	// About 16,000 + 2,000 vertices at 1000/s: 18 s, one process within
	// 20 s.
	if g.Processes == nil || *g.Processes != 1 || g.MeetsTarget == nil || !*g.MeetsTarget || g.ProcessCap != 2 {
		t.Errorf("processes %v, meets %v, cap %d; want 1, true, 2", g.Processes, g.MeetsTarget, g.ProcessCap)
	}

	// The table: the same figures, durations for people.
	code, stdout, stderr := runCLI(t, "lag", cfg, "--handler", "parcels=parcels", "--drain-rate", "1000", "--target", "20s")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	t.Logf("spillway lag FILE --handler parcels=parcels --drain-rate 1000 --target 20s:\n%s", stdout)
	for _, want := range []string{
		"broker: kafka, partition mode",
		"drain rate: 1000 vertices/s per process (--drain-rate)",
		"PROCESSES FOR 20s",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	p0 := g.Partitions[0]
	for _, want := range [][]string{
		{"parcels", "spillway.parcels", "parcels", "0", "103", strconv.FormatInt(p0.Vertices, 10), humanDuration(*p0.Seconds)},
		{"spillway.parcels", "254", strconv.FormatInt(g.Vertices, 10), humanDuration(*g.Seconds), "1 (of at most 2)"},
	} {
		if !hasRow(stdout, want) {
			t.Errorf("table lacks the row %q:\n%s", want, stdout)
		}
	}
}

// hasRow reports whether a line of table has the cells want (cells are
// separated by two spaces or more).
func hasRow(table string, want []string) bool {
	for _, line := range strings.Split(table, "\n") {
		if slices.Equal(cells.Split(strings.TrimSpace(line), -1), want) {
			return true
		}
	}
	return false
}

var cells = regexp.MustCompile(`\s{2,}`)

// TestLagKafkaPartitionCap: in partition mode the processes are capped at
// the partition count, and a partition that alone takes longer than the
// target means no number of processes meets it; key mode has no cap.
func TestLagKafkaPartitionCap(t *testing.T) {
	clearSpillwayEnv(t)
	k := startLagKafka(t)
	k.publish(t, 0, counts(103, 10, 50, 90)) // 16,000 vertices
	p1 := counts(151)
	p1[75] = 500
	k.publish(t, 1, p1) // 2,000 vertices
	partition, key := k.config(t, "partition"), k.config(t, "key")
	for _, tc := range []struct {
		name, cfg, target string
		processes         int
		meets             bool
	}{
		// 18 s of work at 1000/s.
		{"fits", partition, "20s", 1, true},
		{"partition 0 alone is too slow", partition, "10s", 2, false}, // ceil(1.8) = 2 processes, but partition 0 takes 16 s
		{"would need 5", partition, "4s", 2, false},                   // ceil(4.5) = 5, capped at 2
		{"key mode would need 5", key, "4s", 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := lagJSON(t, tc.cfg, "--handler", "parcels=parcels", "--drain-rate", "1000", "--target", tc.target)
			g := rep.Groups[0]
			if g.Vertices < 18000*3/4 || g.Vertices > 18000*5/4 {
				t.Fatalf("%d vertices estimated for 18000", g.Vertices)
			}
			if g.Processes == nil || *g.Processes != tc.processes || g.MeetsTarget == nil || *g.MeetsTarget != tc.meets {
				t.Errorf("processes %v, meets target %v; want %d, %t", g.Processes, g.MeetsTarget, tc.processes, tc.meets)
			}
			if hasNote := strings.Contains(g.Note, "no number of processes"); hasNote == tc.meets {
				t.Errorf("note %q with meets target %t", g.Note, tc.meets)
			}
			if wantCap := map[bool]int{true: 0, false: 2}[tc.cfg == key]; g.ProcessCap != wantCap {
				t.Errorf("process cap %d, want %d", g.ProcessCap, wantCap)
			}
		})
	}
	code, stdout, _ := runCLI(t, "lag", partition, "--handler", "parcels=parcels", "--drain-rate", "1000", "--target", "10s")
	t.Logf("spillway lag FILE --handler parcels=parcels --drain-rate 1000 --target 10s:\n%s", stdout)
	if want := "spillway.parcels: no number of processes drains it within 10s in partition mode: partition 0 alone takes 16s"; code != exitOK || !strings.Contains(stdout, want) {
		t.Errorf("exit %d, table lacks %q:\n%s", code, want, stdout)
	}
}

// lagRedis is a real redis-server with stream parcels whose group
// spillway.parcels a consumer has partly read and acked.
type lagRedis struct {
	srv   *redisproc.Server
	truth int64 // vertices of the entries not acked
	lag   int64 // entries not acked
}

func startLagRedis(t *testing.T) *lagRedis {
	t.Helper()
	srv, err := redisproc.Start("spillway-lag-test-")
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(srv.Close)
	pub, err := redisbroker.NewPublisher(redisbroker.Config{Addr: srv.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx := context.Background()
	if err := srv.Client.XGroupCreateMkStream(ctx, "parcels", "spillway.parcels", "0").Err(); err != nil {
		t.Fatal(err)
	}
	cs := counts(305, 3, 100, 180, 250, 300)
	for i, n := range cs {
		msg := message.NewMessage(strconv.Itoa(i), []byte(strings.Repeat("x", 20)))
		msg.Metadata.Set("vertex_count", strconv.FormatInt(n, 10))
		if err := pub.Publish("parcels", msg); err != nil {
			t.Fatal(err)
		}
	}
	// A consumer has read 50 entries and acked the first 30: 20 pending,
	// 255 not delivered.
	read, err := srv.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "spillway.parcels", Consumer: "c1",
		Streams: []string{"parcels", ">"}, Count: 50}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range read[0].Messages[:30] {
		if err := srv.Client.XAck(ctx, "parcels", "spillway.parcels", e.ID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return &lagRedis{srv: srv, truth: sum(cs[30:]), lag: int64(len(cs) - 30)}
}

// state is the stream's groups and consumers, and the keys.
func (r *lagRedis) state(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	groups, err := r.srv.Client.XInfoGroups(ctx, "parcels").Result()
	if err != nil {
		t.Fatal(err)
	}
	consumers, err := r.srv.Client.XInfoConsumers(ctx, "parcels", "spillway.parcels").Result()
	if err != nil {
		t.Fatal(err)
	}
	for i := range consumers {
		consumers[i].Idle, consumers[i].Inactive = 0, 0 // they tick
	}
	keys, err := r.srv.Client.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return fmt.Sprintf("groups %+v; consumers %+v; keys %v", groups, consumers, keys)
}

func (r *lagRedis) config(t *testing.T) string {
	return writeFile(t, "spillway.yaml", "broker: redis\nredis:\n  addr: "+r.srv.Addr+"\n")
}

// TestLagRedis: the stream's undelivered and pending entries and their
// exact vertices, drain time, uncapped processes, and a group, consumers
// and keys left as they were; a handler whose group does not exist fails
// naming it.
func TestLagRedis(t *testing.T) {
	clearSpillwayEnv(t)
	r := startLagRedis(t)
	cfg := r.config(t)
	before := r.state(t)
	// 255 undelivered + 20 pending, 5 heavy: 25,000 + 270 × 10 vertices.
	rep := lagJSON(t, cfg, "--handler", "parcels=parcels", "--drain-rate", "500", "--target", "10s")
	if b, err := json.MarshalIndent(rep, "", "  "); err == nil {
		t.Logf("spillway lag --json FILE --handler parcels=parcels --drain-rate 500 --target 10s:\n%s", b)
	}
	if after := r.state(t); after != before {
		t.Errorf("state before: %s\nafter: %s", before, after)
	}
	g := rep.Groups[0]
	if len(g.Partitions) != 1 || g.Partitions[0].Partition != -1 {
		t.Fatalf("streams %+v, want one with partition -1", g.Partitions)
	}
	if g.Messages != r.lag || g.Vertices != r.truth {
		t.Errorf("%d messages, %d vertices; want %d, %d", g.Messages, g.Vertices, r.lag, r.truth)
	}
	wantSeconds := float64(r.truth) / 500
	if g.Seconds == nil || math.Abs(*g.Seconds-wantSeconds) > 1e-9 {
		t.Errorf("drain %v s, want %v", g.Seconds, wantSeconds)
	}
	if want := int(math.Ceil(wantSeconds / 10)); g.Processes == nil || *g.Processes != want || g.ProcessCap != 0 || !*g.MeetsTarget {
		t.Errorf("processes %v (cap %d, meets %v), want %d uncapped", g.Processes, g.ProcessCap, g.MeetsTarget, want)
	}
	if rep.Broker != "redis" || rep.Mode != "streams" {
		t.Errorf("broker %q, mode %q", rep.Broker, rep.Mode)
	}

	code, _, stderr := runCLI(t, "lag", cfg, "--handler", "typo=parcels")
	if code != exitFailure || !strings.Contains(stderr, `"spillway.typo"`) {
		t.Errorf("unknown group: exit %d, stderr %q", code, stderr)
	}
}

// TestLagCountsUnstampedAtDefaultCost: entries without a vertex_count
// count at the configuration's budget.default_cost, what the consumers'
// budget charges them.
func TestLagCountsUnstampedAtDefaultCost(t *testing.T) {
	clearSpillwayEnv(t)
	r := startLagRedis(t)
	pub, err := redisbroker.NewPublisher(redisbroker.Config{Addr: r.srv.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range 3 {
		if err := pub.Publish("parcels", message.NewMessage("unstamped-"+strconv.Itoa(i), []byte("{}"))); err != nil {
			t.Fatal(err)
		}
	}
	cfg := writeFile(t, "spillway.yaml", "broker: redis\nredis:\n  addr: "+r.srv.Addr+"\nbudget:\n  default_cost: 700\n")
	rep := lagJSON(t, cfg, "--handler", "parcels=parcels")
	if g := rep.Groups[0]; g.Messages != r.lag+3 || g.Vertices != r.truth+3*700 {
		t.Errorf("%d messages, %d vertices; want %d, %d (3 unstamped at 700)", g.Messages, g.Vertices, r.lag+3, r.truth+3*700)
	}
}

// TestLagMetrics: --metrics averages spillway_drain_rate_per_second of
// the configuration's source over the endpoints (the docs' PromQL
// avg()); without a rate the output says what drain time needs.
func TestLagMetrics(t *testing.T) {
	clearSpillwayEnv(t)
	r := startLagRedis(t)
	cfg := r.config(t)
	// Two processes drain 1000 and 3000 vertices/s; another router of the
	// second process (source "other") is not the one asked about.
	a := pageText(t, "spillway_drain_rate_per_second{otel_scope_name=\"spillway\",source=\"spillway\"} 1000\n")
	b := pageText(t, "spillway_drain_rate_per_second{source=\"spillway\"} 3000\nspillway_drain_rate_per_second{source=\"other\"} 99999\n")
	rep := lagJSON(t, cfg, "--handler", "parcels=parcels", "--metrics", a.URL+"/metrics", "--metrics", b.URL+"/metrics")
	if d := rep.DrainRate; d == nil || d.VerticesPerSecond != 2000 || d.Processes != 2 || d.From != "--metrics" {
		t.Fatalf("drain rate %+v, want 2000 from 2 processes", d)
	}
	if g := rep.Groups[0]; g.Seconds == nil || math.Abs(*g.Seconds-float64(r.truth)/2000) > 1e-9 {
		t.Errorf("drain %v s, want %v", g.Seconds, float64(r.truth)/2000)
	}

	// No process has measured a rate yet.
	none := pageText(t, "spillway_drain_rate_per_second{source=\"other\"} 5\n")
	code, stdout, _ := runCLI(t, "lag", cfg, "--handler", "parcels=parcels", "--metrics", none.URL)
	if code != exitOK || !strings.Contains(stdout, `no endpoint reports spillway_drain_rate_per_second{source="spillway"} yet`) ||
		!hasRow(stdout, []string{"spillway.parcels", strconv.FormatInt(r.lag, 10), strconv.FormatInt(r.truth, 10), "-", "-"}) {
		t.Errorf("exit %d:\n%s", code, stdout)
	}
	// Neither flag.
	code, stdout, _ = runCLI(t, "lag", cfg, "--handler", "parcels=parcels")
	if code != exitOK || !strings.Contains(stdout, "drain time needs the rate one process drains: give --drain-rate or --metrics") {
		t.Errorf("exit %d:\n%s", code, stdout)
	}
	// An endpoint that does not answer.
	gone := pageText(t, "")
	gone.Close()
	code, _, stderr := runCLI(t, "lag", cfg, "--handler", "parcels=parcels", "--metrics", gone.URL)
	if code != exitFailure || !strings.Contains(stderr, "--metrics "+gone.URL) {
		t.Errorf("unreachable endpoint: exit %d, stderr %q", code, stderr)
	}
}

// pageText serves text as a Prometheus text exposition page.
func pageText(t *testing.T, text string) *httptest.Server {
	t.Helper()
	page := "# HELP spillway_drain_rate_per_second Vertices per second this process drains.\n" +
		"# TYPE spillway_drain_rate_per_second gauge\n" + text +
		"# TYPE spillway_budget_vertices gauge\nspillway_budget_vertices{budget=\"spillway\"} 200000\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(page))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestLagBadInput: flags and configurations that cannot work exit with
// code 2 and a message naming the flag or field; a broker that cannot be
// reached exits with 1.
func TestLagBadInput(t *testing.T) {
	clearSpillwayEnv(t)
	kafka := writeFile(t, "kafka.yaml", "broker: kafka\nkafka:\n  brokers: [127.0.0.1:1]\n")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no handler", []string{kafka}, exitBadInput, "--handler is required"},
		{"no equals", []string{kafka, "--handler", "parcels"}, exitBadInput, `--handler "parcels": want NAME=TOPIC`},
		{"no topic", []string{kafka, "--handler", "parcels="}, exitBadInput, `--handler "parcels=": want NAME=TOPIC`},
		{"twice", []string{kafka, "--handler", "a=x", "--handler", "a=y"}, exitBadInput, `handler "a" is named twice`},
		{"target 0", []string{kafka, "--handler", "a=x", "--target", "0s"}, exitBadInput, "--target must be positive"},
		{"target negative", []string{kafka, "--handler", "a=x", "--target", "-1m"}, exitBadInput, "--target must be positive"},
		{"rate 0", []string{kafka, "--handler", "a=x", "--drain-rate", "0"}, exitBadInput, "--drain-rate must be a positive number"},
		{"rate negative", []string{kafka, "--handler", "a=x", "--drain-rate", "-3"}, exitBadInput, "--drain-rate must be a positive number"},
		{"rate and metrics", []string{kafka, "--handler", "a=x", "--drain-rate", "3", "--metrics", "http://h/metrics"}, exitBadInput, "give one"},
		{"metrics not a URL", []string{kafka, "--handler", "a=x", "--metrics", "localhost:9464"}, exitBadInput, `--metrics "localhost:9464": want the http(s) URL`},
		{"invalid config", []string{"testdata/config-invalid.yaml", "--handler", "a=x"}, exitBadInput, "(testdata/config-invalid.yaml:"},
		{"missing config", []string{"testdata/nothing.yaml", "--handler", "a=x"}, exitBadInput, "nothing.yaml"},
		{"memory", []string{writeFile(t, "memory.yaml", "broker: memory\n"), "--handler", "a=x"}, exitBadInput, "broker memory: router: consumer lag unknown for this broker"},
		{"embedded kafka", []string{writeFile(t, "embedded.yaml", "broker: kafka\nkafka:\n  brokers: [embedded]\n"), "--handler", "a=x"}, exitBadInput, "kafka.brokers is [embedded]"},
		{"embedded redis", []string{writeFile(t, "embedded-redis.yaml", "broker: redis\nredis:\n  addr: embedded\n"), "--handler", "a=x"}, exitBadInput, "redis.addr is embedded"},
		{"kafka unreachable", []string{kafka, "--handler", "a=x"}, exitFailure, "router: kafka"},
		{"redis unreachable", []string{writeFile(t, "redis.yaml", "broker: redis\nredis:\n  addr: 127.0.0.1:1\n"), "--handler", "a=x"}, exitFailure, `router: redis.addr "127.0.0.1:1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append([]string{"lag"}, tc.args...)...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, tc.code, tc.want)
			}
			if stdout != "" {
				t.Errorf("stdout %q", stdout)
			}
		})
	}
}

// TestLagProcessesFor: no processes for no backlog, at least one for any
// backlog, the ceiling of drain time over target, the cap in partition
// mode, and a partition slower than the target missing it.
func TestLagProcessesFor(t *testing.T) {
	for _, tc := range []struct {
		seconds  float64
		messages int64
		limit    int
		slowest  float64
		n        int
		meets    bool
	}{
		{0, 0, 0, 0, 0, true},
		{0, 3, 0, 0, 1, true},       // unstamped messages: no vertices, still a backlog
		{0.5, 10, 0, 0, 1, true},    // well within the target
		{60, 10, 0, 0, 1, true},     // exactly the target
		{60.1, 10, 0, 0, 2, true},   // just over
		{250, 10, 0, 0, 5, true},    // no cap
		{250, 10, 3, 100, 3, false}, // would need 5, capped at 3 partitions
		{100, 10, 4, 70, 2, false},  // two processes would do, but one partition alone takes 70 s
		{100, 10, 4, 40, 2, true},
	} {
		n, meets := processesFor(tc.seconds, tc.messages, time.Minute, tc.limit, tc.slowest)
		if n != tc.n || meets != tc.meets {
			t.Errorf("processesFor(%v s, %d messages, limit %d, slowest %v s) = %d, %t; want %d, %t",
				tc.seconds, tc.messages, tc.limit, tc.slowest, n, meets, tc.n, tc.meets)
		}
	}
}
