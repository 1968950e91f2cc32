package telemetry

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// defaultLagInterval is how often a [LagSampler] samples by default.
const defaultLagInterval = 10 * time.Second

// LagSample is a consumer group's lag on one Kafka partition or one Redis
// stream, as a [LagSource] reports it.
type LagSample struct {
	// Topic is the Kafka topic or the Redis stream.
	Topic string
	// Group is the consumer group.
	Group string
	// Partition is the Kafka partition, or -1 for sources without
	// partitions (Redis Streams).
	Partition int32
	// Lag is the number of messages the group has not consumed yet: the
	// high-water mark minus the committed offset on Kafka, the group's lag
	// (plus pending entries, if the source counts them) on Redis Streams.
	Lag int64
	// Vertices is the estimated vertices of those Lag messages, where the
	// source estimates them (router.Router.Backlog does); 0 otherwise.
	Vertices int64
}

func (s LagSample) attributes() attribute.Set {
	if s.Partition < 0 {
		return attribute.NewSet(attrTopic.String(s.Topic), attrGroup.String(s.Group))
	}
	return attribute.NewSet(attrTopic.String(s.Topic), attrGroup.String(s.Group), attrPartition.Int(int(s.Partition)))
}

// LagSource reads consumer lag from a broker: telemetry/kafkatel and
// telemetry/redistel make one, and any function of this shape is one. A
// [LagSampler] calls it from its one background goroutine, with a context
// that ends when the sample times out or the sampler stops; it should
// return every tracked partition or stream in one call. An error discards
// the whole sample (the previous one stays until it is too old).
type LagSource func(ctx context.Context) ([]LagSample, error)

// LagSampler polls a [LagSource] on one background goroutine and caches
// the latest sample, so that lag can be exported as a metric
// ([Metrics.ObserveLag]), used as a pressure signal by shedding
// ([LagSampler.SaturatedFor]) and read by producers before every send
// ([LagSampler.TotalLag], see producer.NewLagThrottled) without
// ever querying the broker per message.
//
// Run it with [LagSampler.Start] and [LagSampler.Close]. Every method is
// safe for concurrent use. TotalLag and SaturatedFor are lock-free.
//
// When the latest successful sample is older than three intervals, the
// sampler forgets it: TotalLag and SaturatedFor return 0 and no lag series
// is exported until a sample succeeds again. A lag that cannot be measured
// therefore never throttles producers or sheds work for ever; the
// spillway.consumer.lag.sample_age and .errors metrics show the failure.
type LagSampler struct {
	src          LagSource
	interval     time.Duration
	timeout      time.Duration
	maxAge       time.Duration
	threshold    int64
	hasThreshold bool

	epoch     time.Time
	total     atomic.Int64
	okAt      atomic.Int64 // 1 + nanoseconds since epoch of the last success; 0: none
	overSince atomic.Int64 // 1 + nanoseconds since epoch when total rose above the threshold; 0: not above

	sampling sync.Mutex // serializes Sample

	mu          sync.Mutex
	samples     []LagSample
	lastSuccess time.Time
	lastErr     error
	sampled     uint64
	errors      uint64

	startOnce sync.Once
	closeOnce sync.Once
	cancel    context.CancelFunc
	done      chan struct{}
}

// NewLagSampler returns a sampler of src. It does not start sampling; call
// [LagSampler.Start]. Relevant options: [WithLagInterval],
// [WithLagThreshold]. It panics if src is nil.
func NewLagSampler(src LagSource, opts ...Option) *LagSampler {
	if src == nil {
		panic("telemetry: NewLagSampler: nil source")
	}
	cfg := newConfig(opts)
	s := &LagSampler{
		src:          src,
		interval:     cfg.lagInterval,
		timeout:      cfg.lagTimeout,
		maxAge:       cfg.lagMaxAge,
		threshold:    cfg.lagThreshold,
		hasThreshold: cfg.hasLagThreshold,
		epoch:        time.Now(),
		done:         make(chan struct{}),
	}
	if s.timeout == 0 {
		s.timeout = s.interval
	}
	if s.maxAge == 0 {
		s.maxAge = 3 * s.interval
	}
	return s
}

// Start runs the sampler on a new goroutine until Close. Calling it again
// does nothing.
func (s *LagSampler) Start() {
	s.startOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		s.cancel = cancel
		go func() {
			defer close(s.done)
			_ = s.run(ctx)
		}()
	})
}

// Close stops a sampler started with Start and waits for its goroutine to
// return (an in-flight sample is cancelled). It is idempotent and safe to
// call without Start. The cached samples stay readable.
func (s *LagSampler) Close() error {
	s.closeOnce.Do(func() {
		started := true
		s.startOnce.Do(func() { started = false })
		if !started {
			close(s.done)
			return
		}
		s.cancel()
	})
	<-s.done
	return nil
}

// run samples at once and then every interval until ctx is done, and
// returns nil then. Failed samples are counted and do not stop it.
func (s *LagSampler) run(ctx context.Context) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		_ = s.Sample(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sample queries the source once, now, and caches the result. Start's
// goroutine calls it every interval; call it directly to refresh the cache
// on demand (in tests, say). Concurrent calls are serialized. It returns
// the source's error; failures are counted (spillway.consumer.lag.errors)
// unless ctx itself ended (the sampler being stopped is not a failure).
func (s *LagSampler) Sample(ctx context.Context) error {
	s.sampling.Lock()
	defer s.sampling.Unlock()
	sctx, cancel := context.WithTimeout(ctx, s.timeout)
	samples, err := s.src(sctx)
	cancel()
	now := time.Now()

	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			// A failure of the source, not the sampler being stopped.
			s.errors++
			s.lastErr = err
		}
		return err
	}
	samples = slices.Clone(samples)
	slices.SortFunc(samples, func(a, b LagSample) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Group, b.Group), cmp.Compare(a.Partition, b.Partition))
	})
	var total int64
	for _, smp := range samples {
		total += max(smp.Lag, 0)
	}
	s.samples = samples
	s.lastSuccess = now
	s.lastErr = nil
	s.sampled++
	s.total.Store(total)
	at := int64(now.Sub(s.epoch)) + 1
	s.okAt.Store(at)
	switch over := s.hasThreshold && total > s.threshold; {
	case over && s.overSince.Load() == 0:
		s.overSince.Store(at)
	case !over:
		s.overSince.Store(0)
	}
	return nil
}

// fresh reports whether the latest successful sample is recent enough.
func (s *LagSampler) fresh(now time.Duration) bool {
	ok := s.okAt.Load()
	return ok != 0 && now-time.Duration(ok-1) <= s.maxAge
}

// TotalLag returns the sum of the lag of every partition or stream in the
// latest sample, or 0 when there is no sample recent enough. It reads the
// cache only and is cheap enough to call before every publish.
func (s *LagSampler) TotalLag() int64 {
	if !s.fresh(time.Since(s.epoch)) {
		return 0
	}
	return s.total.Load()
}

// SaturatedFor returns how long the total lag has been above the threshold
// (see [WithLagThreshold]), measured from the first sample that was above
// it, or 0 when the latest sample is not above it, is too old, or no
// threshold is set. It has the shape of the budget's pressure signal, so
// shedding can use lag as its pressure signal. Lock-free.
func (s *LagSampler) SaturatedFor() time.Duration {
	now := time.Since(s.epoch)
	if !s.fresh(now) {
		return 0
	}
	since := s.overSince.Load()
	if since == 0 {
		return 0
	}
	return max(now-time.Duration(since-1), 1)
}

// latest returns a copy of the latest sample sorted by topic, group and
// partition, or nil when there is no sample recent enough.
func (s *LagSampler) latest() []LagSample {
	if !s.fresh(time.Since(s.epoch)) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples)
}

// lagStats describes a sampler's state.
type lagStats struct {
	Total        int64         // as TotalLag
	SaturatedFor time.Duration // as SaturatedFor
	Partitions   int           // partitions or streams in the latest sample (0 if stale)
	Sampled      uint64        // successful samples
	Errors       uint64        // failed samples
	LastSuccess  time.Time     // zero before the first success
	LastError    error         // of the latest sample; nil if it succeeded
}

// stats returns a snapshot of the sampler's state, for [Metrics.ObserveLag].
func (s *LagSampler) stats() lagStats {
	st := lagStats{Total: s.TotalLag(), SaturatedFor: s.SaturatedFor()}
	fresh := s.fresh(time.Since(s.epoch))
	s.mu.Lock()
	if fresh {
		st.Partitions = len(s.samples)
	}
	st.Sampled, st.Errors = s.sampled, s.errors
	st.LastSuccess, st.LastError = s.lastSuccess, s.lastErr
	s.mu.Unlock()
	return st
}
