package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// kcatPath returns the kcat binary (Debian's package, installed by make
// deps). The test is skipped without it, or fails when
// SPILLWAY_REQUIRE_KCAT=1 (CI sets it).
func kcatPath(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("SPILLWAY_REQUIRE_KCAT") == "1" {
			t.Fatal("kcat not installed and SPILLWAY_REQUIRE_KCAT=1:", err)
		}
		t.Skip("kcat not installed (make deps installs it):", err)
	}
	return path
}

// kcat runs kcat with args against brokers, stdin as its input, and
// returns its standard output.
func kcat(t *testing.T, path string, brokers []string, stdin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, append([]string{"-b", strings.Join(brokers, ","), "-q"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kcat %v: %v: %s", args, err, stderr.String())
	}
	return stdout.Bytes()
}

// TestKafkaInteropKcat: a librdkafka client (kcat, as a separate process)
// and Spillway share the embedded broker, itself a separate process.
// kcat produces keyed records, with its own partitioner, carrying a valid,
// a missing, a malformed and a negative vertex_count header; Spillway
// consumes them in key mode and handles every record once, in order per
// key, never two of one key at once. kcat then reads what
// Router.Publisher() wrote, keys and headers intact.
func TestKafkaInteropKcat(t *testing.T) {
	path := kcatPath(t)
	const (
		in, out = "interop-in", "interop-out"
		keys    = 16
		perCall = 64
	)
	broker := kafkatest.Start(t, 4, in, out)
	brokers := broker.Brokers()

	// One kcat call per header variant (kcat's -H applies to every record
	// of a call); records are "key|key,seq", seq rising per key across
	// calls.
	headers := [][]string{{"-H", cost.MetadataKey + "=40"}, nil, {"-H", cost.MetadataKey + "=many"}, {"-H", cost.MetadataKey + "=-3"}}
	seq := map[string]int{}
	total := 0
	for _, h := range headers {
		var lines strings.Builder
		for i := range perCall {
			k := "k" + strconv.Itoa(i%keys)
			fmt.Fprintf(&lines, "%s|%s,%d\n", k, k, seq[k])
			seq[k]++
			total++
		}
		kcat(t, path, brokers, lines.String(), append([]string{"-P", "-t", in, "-K", "|"}, h...)...)
	}

	cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
	cfg.Budget.Vertices = 400
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.Version = "2.3.0"
	cfg.Kafka.Partitions = 4
	cfg.Kafka.HeartbeatInterval = 250 * time.Millisecond
	cfg.Kafka.Consumer = kafkabroker.ConsumerKey
	var (
		mu       sync.Mutex
		seen     = map[string]int{} // key,seq → times handled
		next     = map[string]int{} // key → the seq expected next
		inFlight = map[string]int{}
		overlap  int
		disorder []string
	)
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddConsumerHandler("h", in, func(msg *message.Message) error {
		k, s, _ := strings.Cut(string(msg.Payload), ",")
		n, _ := strconv.Atoi(s)
		mu.Lock()
		if inFlight[k]++; inFlight[k] > 1 {
			overlap++
		}
		if n != next[k] {
			disorder = append(disorder, fmt.Sprintf("%s: %d after %d", k, n, next[k]-1))
		}
		next[k] = n + 1
		seen[string(msg.Payload)]++
		mu.Unlock()
		time.Sleep(2 * time.Millisecond) // long enough for records of other keys to overlap
		mu.Lock()
		inFlight[k]--
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.Background()) }()
	defer func() {
		if err := r.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		<-runErr
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n >= total || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a duplicate, if any, shows up now
	mu.Lock()
	dups := 0
	for _, c := range seen {
		if c > 1 {
			dups++
		}
	}
	if len(seen) != total || dups != 0 || overlap != 0 || len(disorder) != 0 {
		t.Errorf("of %d kcat records: %d handled, %d more than once, %d times two of one key at once, order broken: %v",
			total, len(seen), dups, overlap, disorder)
	}
	mu.Unlock()

	// Spillway's output, read by kcat.
	const published = 8
	for i := range published {
		msg := message.NewMessage(fmt.Sprintf("out-%d", i), []byte(fmt.Sprintf("payload %d", i)))
		msg.Metadata.Set("entity_id", "e"+strconv.Itoa(i))
		msg.Metadata.Set("note", "a=b, c:d")
		msg.Metadata.Set(cost.MetadataKey, strconv.Itoa(10+i))
		if err := r.Publisher().Publish(out, msg); err != nil {
			t.Fatal(err)
		}
	}
	raw := kcat(t, path, brokers, "", "-C", "-t", out, "-o", "beginning", "-e", "-J")
	var records []struct {
		Key     string   `json:"key"`
		Payload string   `json:"payload"`
		Headers []string `json:"headers"`
	}
	for line := range bytes.SplitSeq(bytes.TrimSpace(raw), []byte("\n")) {
		var rec struct {
			Key     string   `json:"key"`
			Payload string   `json:"payload"`
			Headers []string `json:"headers"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("kcat output %q: %v", line, err)
		}
		records = append(records, rec)
	}
	if len(records) != published {
		t.Fatalf("kcat read %d records of %s, want %d", len(records), out, published)
	}
	for _, rec := range records {
		h := map[string]string{}
		for i := 0; i+1 < len(rec.Headers); i += 2 {
			h[rec.Headers[i]] = rec.Headers[i+1]
		}
		i, err := strconv.Atoi(strings.TrimPrefix(rec.Payload, "payload "))
		if err != nil {
			t.Errorf("payload %q", rec.Payload)
			continue
		}
		want := map[string]string{"_watermill_message_uuid": fmt.Sprintf("out-%d", i), "entity_id": "e" + strconv.Itoa(i),
			"note": "a=b, c:d", cost.MetadataKey: strconv.Itoa(10 + i)}
		for k, v := range want {
			if h[k] != v {
				t.Errorf("record %d: header %s = %q, want %q (headers %v)", i, k, h[k], v, rec.Headers)
			}
		}
		if rec.Key != "e"+strconv.Itoa(i) {
			t.Errorf("record %d: key %q, want e%d", i, rec.Key, i)
		}
	}
}
