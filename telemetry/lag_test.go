package telemetry_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/producer"
	"github.com/spillway-go/spillway/telemetry"
)

// fakeSource returns whatever it was last given, counting its calls.
type fakeSource struct {
	mu      sync.Mutex
	samples []telemetry.LagSample
	err     error
	calls   atomic.Int64
}

func (f *fakeSource) set(err error, samples ...telemetry.LagSample) {
	f.mu.Lock()
	f.samples, f.err = samples, err
	f.mu.Unlock()
}

func (f *fakeSource) Lag(ctx context.Context) ([]telemetry.LagSample, error) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.samples, f.err
}

func kafkaLag(p int32, lag int64) telemetry.LagSample {
	return telemetry.LagSample{Topic: "parcels", Group: "workers", Partition: p, Lag: lag}
}

// The sampler polls in the background at its interval, never on read, and
// its pressure signal follows the threshold.
func TestLagSamplerBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{}
		src.set(nil, kafkaLag(1, 40), kafkaLag(0, 30))
		s := telemetry.NewLagSampler(src.Lag, telemetry.WithLagInterval(time.Second), telemetry.WithLagThreshold(100))
		s.Start()
		defer s.Close()
		synctest.Wait()
		if got := src.calls.Load(); got != 1 {
			t.Fatalf("%d calls after start, want 1 (sample at once)", got)
		}
		for range 1000 {
			_ = s.TotalLag()
			_ = s.SaturatedFor()
		}
		if got := src.calls.Load(); got != 1 {
			t.Fatalf("reads queried the source: %d calls", got)
		}
		if got := s.TotalLag(); got != 70 {
			t.Fatalf("TotalLag = %d, want 70", got)
		}
		if got := s.Samples(); len(got) != 2 || got[0].Partition != 0 || got[1].Partition != 1 {
			t.Fatalf("samples not sorted by partition: %+v", got)
		}
		if s.SaturatedFor() != 0 {
			t.Fatal("saturated below the threshold")
		}

		src.set(nil, kafkaLag(0, 90), kafkaLag(1, 40))
		time.Sleep(time.Second)
		synctest.Wait()
		if got := s.TotalLag(); got != 130 {
			t.Fatalf("TotalLag = %d, want 130", got)
		}
		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		if got := s.SaturatedFor(); got != 2500*time.Millisecond {
			t.Fatalf("SaturatedFor = %v, want 2.5s (since the first sample above)", got)
		}
		if got := src.calls.Load(); got != 4 {
			t.Fatalf("%d calls after 3.5 s at 1 s, want 4", got)
		}

		src.set(nil, kafkaLag(0, 10))
		time.Sleep(500 * time.Millisecond) // next tick
		synctest.Wait()
		if s.SaturatedFor() != 0 || s.TotalLag() != 10 {
			t.Fatalf("after lag fell: saturated %v, total %d", s.SaturatedFor(), s.TotalLag())
		}
	})
}

// Failed samples keep the last good one until it is too old, then the
// sampler forgets it (fail open) and counts the errors.
func TestLagSamplerStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{}
		src.set(nil, telemetry.LagSample{Topic: "s", Group: "g", Partition: -1, Lag: 500})
		s := telemetry.NewLagSampler(src.Lag, telemetry.WithLagInterval(time.Second), telemetry.WithLagThreshold(0),
			telemetry.WithLagMaxAge(2500*time.Millisecond))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- s.Run(ctx) }()
		synctest.Wait()
		boom := errors.New("broker unreachable")
		src.set(boom)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if s.TotalLag() != 500 || s.SaturatedFor() != 2*time.Second {
			t.Fatalf("within max age: total %d, saturated %v", s.TotalLag(), s.SaturatedFor())
		}
		time.Sleep(time.Second)
		synctest.Wait()
		st := s.Stats()
		if s.TotalLag() != 0 || s.SaturatedFor() != 0 || s.Samples() != nil || st.Partitions != 0 {
			t.Fatalf("stale sample still used: %+v", st)
		}
		if st.Errors != 3 || st.Sampled != 1 || !errors.Is(st.LastError, boom) {
			t.Fatalf("stats = %+v", st)
		}
		src.set(nil, telemetry.LagSample{Topic: "s", Group: "g", Partition: -1, Lag: 5})
		time.Sleep(time.Second)
		synctest.Wait()
		if st := s.Stats(); st.Total != 5 || st.LastError != nil || st.Partitions != 1 {
			t.Fatalf("after recovery: %+v", st)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run returned %v", err)
		}
	})
}

// A slow source is cut off by the timeout; Close cancels an in-flight sample.
func TestLagSamplerTimeoutAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var deadlines atomic.Int64
		src := telemetry.LagSource(func(ctx context.Context) ([]telemetry.LagSample, error) {
			<-ctx.Done()
			deadlines.Add(1)
			return nil, ctx.Err()
		})
		s := telemetry.NewLagSampler(src, telemetry.WithLagInterval(time.Second), telemetry.WithLagTimeout(300*time.Millisecond))
		s.Start()
		s.Start() // no-op
		// Samples start at 0 s, 1 s and 2 s; the first two time out after
		// 300 ms, the third is in flight.
		time.Sleep(2100 * time.Millisecond)
		synctest.Wait()
		if got := deadlines.Load(); got != 2 {
			t.Fatalf("%d timed-out samples, want 2", got)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil { // idempotent
			t.Fatal(err)
		}
		// Close cancelled the third, which is not counted as a failure.
		if st := s.Stats(); st.Errors != 2 || !errors.Is(st.LastError, context.DeadlineExceeded) {
			t.Fatalf("stats = %+v", st)
		}
	})
	// Close without Start returns at once.
	if err := telemetry.NewLagSampler((&fakeSource{}).Lag).Close(); err != nil {
		t.Fatal(err)
	}
}

// The lag gauge reads the sampler's cache: N published, M consumed reads
// N−M per partition (and per stream for sources without partitions).
func TestLagMetric(t *testing.T) {
	mp, reader := newMeterProvider()
	m, err := telemetry.NewMetrics(telemetry.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{}
	src.set(nil, kafkaLag(0, 10-4), kafkaLag(1, 0 /* 7 published, 7 consumed */), telemetry.LagSample{Topic: "events", Group: "g", Partition: -1, Lag: 3})
	s := telemetry.NewLagSampler(src.Lag, telemetry.WithLagThreshold(5))
	if err := s.Sample(context.Background()); err != nil {
		t.Fatal(err)
	}
	unregister, err := m.ObserveLag("kafka", s)
	if err != nil {
		t.Fatal(err)
	}
	rm := collect(t, reader)
	for _, c := range []struct {
		attrs map[string]string
		want  float64
	}{
		{map[string]string{"topic": "parcels", "group": "workers", "partition": "0"}, 6},
		{map[string]string{"topic": "parcels", "group": "workers", "partition": "1"}, 0},
		{map[string]string{"topic": "events", "group": "g"}, 3},
	} {
		if got := mustPoint(t, rm, "spillway.consumer.lag", c.attrs); got != c.want {
			t.Errorf("lag%v = %v, want %v", c.attrs, got, c.want)
		}
	}
	src0 := map[string]string{"source": "kafka"}
	if got := mustPoint(t, rm, "spillway.consumer.lag.errors", src0); got != 0 {
		t.Errorf("errors = %v", got)
	}
	if got := mustPoint(t, rm, "spillway.consumer.lag.saturated", src0); !(got > 0) {
		t.Errorf("saturated = %v, want > 0 (total 9 > 5)", got)
	}
	if got := mustPoint(t, rm, "spillway.consumer.lag.sample_age", src0); got < 0 || got > 60 {
		t.Errorf("sample age = %v", got)
	}
	if err := unregister(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ObserveLag("x", nil); err == nil {
		t.Error("nil sampler accepted")
	}
}

// The sampler drives the lag throttle and satisfies the shedding pressure
// shape.
func TestLagSamplerDrivesThrottle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{}
		src.set(nil, kafkaLag(0, 3000))
		s := telemetry.NewLagSampler(src.Lag, telemetry.WithLagInterval(time.Second))
		s.Start()
		defer s.Close()
		synctest.Wait()

		var _ interface{ SaturatedFor() time.Duration } = s
		p, err := producer.NewLagThrottled(&recorder{}, s, producer.LagThrottleConfig{Threshold: 1000})
		if err != nil {
			t.Fatal(err)
		}
		publish := func() time.Duration { // the time one Publish waits
			start := time.Now()
			if err := p.Publish("t", message.NewMessage("m", nil)); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}
		if d := publish(); d != 200*time.Millisecond {
			t.Fatalf("delay at lag 3000 = %v, want 200ms", d)
		}
		src.set(nil, kafkaLag(0, 500))
		time.Sleep(time.Second)
		synctest.Wait()
		if d := publish(); d != 0 {
			t.Fatalf("delay after lag fell = %v, want 0", d)
		}
	})
}
