package cost_test

import (
	"context"
	"encoding/binary"
	"errors"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/spillway-go/spillway/cost"
)

// recorder is a message.Publisher that remembers what it was given.
type recorder struct {
	mu     sync.Mutex
	calls  [][]*message.Message
	topics []string
	err    error // returned by Publish
	closed int
}

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.topics = append(r.topics, topic)
	r.calls = append(r.calls, msgs)
	return r.err
}

func (r *recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed++
	return nil
}

func (r *recorder) published() []*message.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all []*message.Message
	for _, c := range r.calls {
		all = append(all, c...)
	}
	return all
}

func TestStampingPublisher(t *testing.T) {
	key := cost.MetadataKey
	wkbLine := string(newWKB().header(2).u32(3).f64(0, 0, 1, 1, 2, 2).bytes())
	tests := []struct {
		name    string
		opts    []cost.Option
		payload string
		meta    map[string]string
		want    string // the count after publishing
	}{
		{"stamps missing", nil, squareGeoJSON, nil, "5"},
		{"stamps empty value", nil, squareGeoJSON, map[string]string{key: ""}, "5"},
		{"keeps valid", nil, squareGeoJSON, map[string]string{key: "999"}, "999"},
		{"keeps valid with plus", nil, squareGeoJSON, map[string]string{key: "+999"}, "+999"},
		{"replaces malformed", nil, squareGeoJSON, map[string]string{key: "abc"}, "5"},
		{"replaces negative", nil, squareGeoJSON, map[string]string{key: "-5"}, "5"},
		{"replaces zero for non-empty payload", nil, squareGeoJSON, map[string]string{key: "0"}, "5"},
		{"stamps wkb", nil, wkbLine, nil, "3"},
		{"stamps empty payload zero", nil, "", nil, "0"},
		{"stamps empty geometry one", nil, `{"type":"GeometryCollection","geometries":[]}`, nil, "1"},
		{"stamps null-geometry feature one", nil, `{"type":"Feature","geometry":null}`, nil, "1"},
		{"nil option", []cost.Option{nil}, squareGeoJSON, nil, "5"},
		{"the estimator's options are ignored", []cost.Option{cost.WithComputeMissing()}, squareGeoJSON, map[string]string{key: "999"}, "999"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			p := cost.NewStampingPublisher(rec, tt.opts...)
			msg := newMsg(tt.payload, tt.meta)
			if err := p.Publish("topic", msg); err != nil {
				t.Fatal(err)
			}
			got := rec.published()
			if len(got) != 1 || got[0] != msg || rec.topics[0] != "topic" {
				t.Fatalf("published %v to %v, want the message on topic", got, rec.topics)
			}
			if v := msg.Metadata.Get(key); v != tt.want {
				t.Errorf("%s = %q, want %q", key, v, tt.want)
			}
			// Whatever was stamped is trusted downstream.
			if c := cost.NewEstimator(cost.FullBudget).Estimate(msg); c.Source != cost.SourceHeader {
				t.Errorf("estimator read the stamp as %v", c.Source)
			}
		})
	}
}

func TestStampingPublisherAllOrNothing(t *testing.T) {
	rec := &recorder{}
	p := cost.NewStampingPublisher(rec)
	good1 := message.NewMessage("good-1", message.Payload(squareGeoJSON))
	bad := message.NewMessage("bad-uuid", message.Payload("definitely not geometry"))
	bad.Metadata.Set(cost.MetadataKey, "malformed!")
	good2 := message.NewMessage("good-2", message.Payload(squareGeoJSON))
	good2.Metadata.Set("other", "x")
	batch := []*message.Message{good1, bad, good2}
	before := make([]message.Metadata, len(batch))
	for i, m := range batch {
		before[i] = maps.Clone(m.Metadata)
	}

	err := p.Publish("topic", batch...)
	if !errors.Is(err, cost.ErrUnstampable) {
		t.Fatalf("error %v, want ErrUnstampable", err)
	}
	if !errors.Is(err, cost.ErrMalformed) {
		t.Errorf("error %v does not wrap the decode error", err)
	}
	for _, want := range []string{"bad-uuid", "message 1 of 3"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if len(rec.calls) != 0 {
		t.Errorf("published %d calls, want none", len(rec.calls))
	}
	for i, m := range batch {
		if !maps.Equal(m.Metadata, before[i]) {
			t.Errorf("message %d metadata changed: %v, was %v", i, m.Metadata, before[i])
		}
	}
}

func TestStampingPublisherEdgeCases(t *testing.T) {
	t.Run("nil message", func(t *testing.T) {
		rec := &recorder{}
		good := newMsg(squareGeoJSON, nil)
		err := cost.NewStampingPublisher(rec).Publish("t", good, nil)
		if !errors.Is(err, cost.ErrUnstampable) || len(rec.calls) != 0 || len(good.Metadata) != 0 {
			t.Errorf("error %v, %d calls, metadata %v", err, len(rec.calls), good.Metadata)
		}
	})
	t.Run("nil metadata", func(t *testing.T) {
		rec := &recorder{}
		msg := &message.Message{UUID: "u", Payload: message.Payload(squareGeoJSON)}
		if err := cost.NewStampingPublisher(rec).Publish("t", msg); err != nil {
			t.Fatal(err)
		}
		if msg.Metadata.Get(cost.MetadataKey) != "5" {
			t.Errorf("metadata %v", msg.Metadata)
		}
	})
	t.Run("no messages", func(t *testing.T) {
		rec := &recorder{}
		if err := cost.NewStampingPublisher(rec).Publish("t"); err != nil || len(rec.calls) != 1 {
			t.Errorf("error %v, %d calls; want the empty call passed on", err, len(rec.calls))
		}
	})
	t.Run("publish error", func(t *testing.T) {
		boom := errors.New("boom")
		rec := &recorder{err: boom}
		msg := newMsg(squareGeoJSON, nil)
		if err := cost.NewStampingPublisher(rec).Publish("t", msg); !errors.Is(err, boom) {
			t.Errorf("error %v, want the publisher's", err)
		}
		if msg.Metadata.Get(cost.MetadataKey) != "5" {
			t.Errorf("a message handed to the publisher should stay stamped: %v", msg.Metadata)
		}
	})
	t.Run("nil publisher", func(t *testing.T) {
		defer func() {
			if recover() == nil {
				t.Error("NewStampingPublisher(nil) did not panic")
			}
		}()
		cost.NewStampingPublisher(nil)
	})
	t.Run("close", func(t *testing.T) {
		rec := &recorder{}
		if err := cost.NewStampingPublisher(rec).Close(); err != nil || rec.closed != 1 {
			t.Errorf("Close: %v, closed %d times", err, rec.closed)
		}
	})
}

// TestStampingPublisherRealData stamps every real feature, in GeoJSON and
// EWKB, in batches, and checks the stamps against CountPayload.
func TestStampingPublisherRealData(t *testing.T) {
	rec := &recorder{}
	p := cost.NewStampingPublisher(rec)
	lines := readLines(t, countriesFile)
	var batch []*message.Message
	want := map[string]string{}
	for i, line := range lines {
		n, err := cost.CountPayload(line)
		if err != nil {
			t.Fatal(err)
		}
		id := strconv.Itoa(i)
		batch = append(batch, message.NewMessage("geojson-"+id, line))
		ewkbPayload := mustEWKB(t, withSRID(t, decodeFeature(t, line), 4326), binary.LittleEndian)
		batch = append(batch, message.NewMessage("ewkb-"+id, ewkbPayload))
		want["geojson-"+id] = strconv.Itoa(n)
		want["ewkb-"+id] = strconv.Itoa(n)
		if len(batch) == 16 || i == len(lines)-1 {
			if err := p.Publish("countries", batch...); err != nil {
				t.Fatal(err)
			}
			batch = nil
		}
	}
	got := rec.published()
	if len(got) != 2*len(lines) {
		t.Fatalf("published %d messages, want %d", len(got), 2*len(lines))
	}
	for _, m := range got {
		if v := m.Metadata.Get(cost.MetadataKey); v != want[m.UUID] {
			t.Errorf("%s stamped %q, want %q", m.UUID, v, want[m.UUID])
		}
	}
}

func TestStampingPublisherConcurrent(t *testing.T) {
	rec := &recorder{}
	p := cost.NewStampingPublisher(rec)
	lines := readLines(t, countiesFile)[:64]
	var wg sync.WaitGroup
	errs := make(chan error, len(lines))
	for _, line := range lines {
		wg.Go(func() {
			errs <- p.Publish("counties", message.NewMessage(watermill.NewUUID(), line))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range rec.published() {
		n, _ := cost.CountPayload(m.Payload)
		if m.Metadata.Get(cost.MetadataKey) != strconv.Itoa(n) {
			t.Errorf("%s stamped %q, want %d", m.UUID, m.Metadata.Get(cost.MetadataKey), n)
		}
	}
}

// TestStampingPublisherGoChannel runs the stamp through a real watermill
// Pub/Sub to the estimator on the consuming side.
func TestStampingPublisherGoChannel(t *testing.T) {
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 8}, watermill.NopLogger{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs, err := pubSub.Subscribe(ctx, "shapes")
	if err != nil {
		t.Fatal(err)
	}
	p := cost.NewStampingPublisher(pubSub)
	t.Cleanup(func() { _ = p.Close() })
	if err := p.Publish("shapes", message.NewMessage("sq", message.Payload(squareGeoJSON))); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		m.Ack()
		c := cost.NewEstimator(cost.FullBudget).Estimate(m)
		if c.Vertices != 5 || c.Source != cost.SourceHeader {
			t.Errorf("consumer charged %+v, want 5 from the header", c)
		}
	case <-ctx.Done():
		t.Fatal("no message received")
	}
}

// With WithSkipUncountable a payload that cannot be counted is published
// as it is, and the rest of the call is stamped as usual.
func TestStampingPublisherSkipUncountable(t *testing.T) {
	rec := &recorder{}
	p := cost.NewStampingPublisher(rec, cost.WithSkipUncountable())
	good := message.NewMessage("good", message.Payload(squareGeoJSON))
	bad := message.NewMessage("bad", message.Payload(`{"orderId":1}`))
	if err := p.Publish("topic", good, bad); err != nil {
		t.Fatal(err)
	}
	if len(rec.calls) != 1 || len(rec.calls[0]) != 2 {
		t.Fatalf("calls = %v, want both messages in one call", rec.calls)
	}
	if good.Metadata.Get(cost.MetadataKey) != "5" {
		t.Errorf("good stamped %q, want 5", good.Metadata.Get(cost.MetadataKey))
	}
	if _, ok := bad.Metadata[cost.MetadataKey]; ok {
		t.Errorf("uncountable message stamped %q, want no count", bad.Metadata.Get(cost.MetadataKey))
	}
}
