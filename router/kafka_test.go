package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// TestWithSaramaConfig: the hook of kafkabroker.WithSaramaConfig, given
// with WithKafka, runs last on the publisher's, every subscriber's and the
// admin/lag client's Sarama configuration, and its error fails New.
func TestWithSaramaConfig(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
	cfg.Kafka.Brokers = []string{spillway.Embedded}
	cfg.Kafka.Partitions = 1
	cfg.Kafka.HeartbeatInterval = 300 * time.Millisecond
	var (
		mu    sync.Mutex
		kinds = map[string]int{}
	)
	hook := func(c *sarama.Config) error {
		if c.ClientID != "spillway" || c.Version != sarama.V2_3_0_0 {
			t.Errorf("hook ran before the kafka section was applied: client id %q, version %v", c.ClientID, c.Version)
		}
		kind := "admin"
		switch {
		case c.Consumer.Group.Heartbeat.Interval == 300*time.Millisecond:
			kind = "subscriber"
		case c.Producer.Return.Successes:
			kind = "publisher"
		}
		mu.Lock()
		kinds[kind]++
		mu.Unlock()
		c.ClientID = "hooked"
		return nil
	}
	r, err := New(cfg, nil, WithKafka(kafkabroker.WithSaramaConfig(hook)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.AddConsumerHandler("h", "hooked", func(*message.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.Lag(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for _, k := range []string{"admin", "publisher", "subscriber"} {
		if kinds[k] == 0 {
			t.Errorf("hook never called for the %s configuration (%v)", k, kinds)
		}
	}
	mu.Unlock()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	errNo := errors.New("refused by hook")
	_, err = New(cfg, nil, WithKafka(kafkabroker.WithSaramaConfig(func(*sarama.Config) error { return errNo })))
	if !errors.Is(err, errNo) {
		t.Errorf("New with a failing hook = %v, want its error", err)
	}
}

// TestKafkaConfigErrorsNamed: kafkabroker's field errors come out of the
// router's Validate as FieldErrors under kafka.
func TestKafkaConfigErrorsNamed(t *testing.T) {
	c := Config{Broker: brokerKafka}
	c.Kafka.Brokers = []string{"ok:9092", "no-port"}
	c.Kafka.SASL.Mechanism = "GSSAPI"
	err := c.Validate()
	want := map[string]string{"kafka.brokers[1]": "no-port", "kafka.sasl.mechanism": "GSSAPI"}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ce *spillway.FieldError
		if errors.As(e, &ce) && want[ce.Field] == ce.Value {
			delete(want, ce.Field)
		}
	}
	if len(want) > 0 {
		t.Errorf("missing %v in %v", want, err)
	}
}

// largeFeatureCollection builds a GeoJSON FeatureCollection of at least
// minBytes from the countries test data, repeating its features (with
// fresh ids) as often as needed.
func largeFeatureCollection(t *testing.T, minBytes int) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "testdata", "countries-land-10km.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	var b bytes.Buffer
	b.WriteString(`{"type":"FeatureCollection","features":[`)
	for i := 0; b.Len() < minBytes; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		var f map[string]any
		if err := json.Unmarshal(lines[i%len(lines)], &f); err != nil {
			t.Fatal(err)
		}
		f["id"] = fmt.Sprintf("%v-%d", f["id"], i/len(lines))
		enc, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(enc)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// TestLargeMessage: with kafka.max_message_bytes a 2.7 MB GeoJSON feature
// collection goes through the router (producer limit, topic
// max.message.bytes, consumer fetch limit) and arrives whole, stamped with
// its vertex count; without it the producer refuses it.
func TestLargeMessage(t *testing.T) {
	defer goleak.VerifyNone(t, leakOptions...)
	payload := largeFeatureCollection(t, 2_700_000)
	vertices, err := cost.CountPayload(payload)
	if err != nil {
		t.Fatal(err)
	}
	cluster := kafkatest.Start(t, 1)

	newCfg := func(maxBytes int32) Config {
		cfg := Config{Broker: brokerKafka, CloseTimeout: 10 * time.Second}
		cfg.Kafka.Brokers = cluster.Brokers()
		cfg.Kafka.Version = "2.3.0" // kfake's limit
		cfg.Kafka.Partitions = 1
		cfg.Kafka.CreateTopics = true
		cfg.Kafka.MaxMessageBytes = maxBytes
		cfg.Kafka.HeartbeatInterval = 200 * time.Millisecond
		return cfg
	}

	// Without the setting: Sarama's 1 MB producer limit.
	small, err := New(newCfg(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = small.Publisher().Publish("big-default", message.NewMessage("too-big", payload))
	if err == nil || !strings.Contains(err.Error(), "MaxMessageBytes") {
		t.Errorf("publishing %d bytes without max_message_bytes = %v, want Sarama's MaxMessageBytes refusal", len(payload), err)
	}
	if err := small.Close(); err != nil {
		t.Fatal(err)
	}

	cfg := newCfg(4 << 20)
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make(chan *message.Message, 1)
	if _, err := r.AddConsumerHandler("big", "big", func(m *message.Message) error {
		got <- m
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	sc := sarama.NewConfig()
	sc.Version = sarama.V2_3_0_0
	admin, err := sarama.NewClusterAdmin(r.back.(*kafkaBackend).cluster.Brokers(), sc)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	results, err := admin.DescribeConfigs([]*sarama.ConfigResource{{Type: sarama.TopicResource, Name: "big", ConfigNames: []string{"max.message.bytes"}}},
		sarama.DescribeConfigsOptions{})
	if err != nil || len(results) != 1 || results[0].ErrorCode != sarama.ErrNoError {
		t.Fatalf("describing topic big: %+v, %v", results, err)
	}
	entries := results[0].Configs
	want := strconv.Itoa(4<<20 + 1<<10) // 1 KiB of record-batch headroom
	if len(entries) != 1 || entries[0].Value != want {
		t.Errorf("topic big: max.message.bytes %+v, want %s", entries, want)
	}

	errc := runRouter(t, r)
	if err := r.Publisher().Publish("big", message.NewMessage("big-1", payload)); err != nil {
		t.Fatalf("publishing %d bytes: %v", len(payload), err)
	}
	select {
	case m := <-got:
		if !bytes.Equal(m.Payload, payload) {
			t.Errorf("payload of %d bytes arrived as %d bytes", len(payload), len(m.Payload))
		}
		if v := m.Metadata.Get(cost.MetadataKey); v != strconv.Itoa(vertices) {
			t.Errorf("vertex_count %q, want %d", v, vertices)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("large message never delivered")
	}
	closeRouter(t, r, errc)
}
