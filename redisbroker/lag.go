package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/telemetry"
)

// Errors returned by [Lag].
var (
	ErrNoStream = errors.New("redisbroker: no such stream")
	ErrNoGroup  = errors.New("redisbroker: no such consumer group")
)

// LagInfo is a consumer group's position in one stream, from XINFO GROUPS
// (Redis 7 or later for Lag and EntriesRead).
type LagInfo struct {
	Stream, Group string
	// Lag is the number of entries not yet delivered to the group, or -1
	// when Redis cannot tell (after XDEL of entries the group has not read,
	// or on servers older than 7.0).
	Lag int64
	// Pending is the number of entries delivered but not yet acknowledged:
	// in flight, waiting for budget, or left by a dead consumer.
	Pending int64
	// EntriesRead is the group's logical read counter.
	EntriesRead int64
	// LastDeliveredID is the ID of the last entry delivered to the group.
	LastDeliveredID string
	// Consumers is the number of consumers in the group.
	Consumers int64
	// SampledAt is when the sample was taken.
	SampledAt time.Time
}

// Backlog returns the work the group still has on this stream: undelivered
// entries (Lag, taken as 0 when unknown) plus pending ones.
func (l LagInfo) Backlog() int64 { return max(l.Lag, 0) + l.Pending }

// Lag reads the position of group in stream with one XINFO GROUPS. It
// returns an error wrapping ErrNoStream or ErrNoGroup when either is missing.
func Lag(ctx context.Context, client redis.UniversalClient, stream, group string) (LagInfo, error) {
	groups, err := client.XInfoGroups(ctx, stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return LagInfo{}, fmt.Errorf("%w: %q", ErrNoStream, stream)
		}
		return LagInfo{}, fmt.Errorf("redisbroker: XINFO GROUPS %q: %w", stream, err)
	}
	for _, g := range groups {
		if g.Name == group {
			return LagInfo{
				Stream:          stream,
				Group:           group,
				Lag:             g.Lag,
				Pending:         g.Pending,
				EntriesRead:     g.EntriesRead,
				LastDeliveredID: g.LastDeliveredID,
				Consumers:       g.Consumers,
				SampledAt:       time.Now(),
			}, nil
		}
	}
	return LagInfo{}, fmt.Errorf("%w: %q on stream %q", ErrNoGroup, group, stream)
}

// LagSampler samples the lag of one consumer group on a set of streams, on
// one goroutine, every interval: never per message. Its readers
// ([LagSampler.Samples], [LagSampler.Backlog]) return the latest samples
// without touching Redis, so they are cheap enough for a pressure signal
// checked on every admission. It is safe for concurrent use.
type LagSampler struct {
	client   redis.UniversalClient
	group    string
	interval time.Duration
	logger   watermill.LoggerAdapter

	mu      sync.Mutex
	streams []string
	samples map[string]LagInfo

	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// NewLagSampler starts a sampler of group's lag using client, which it does
// not close. Add streams with Track; stop it with Close.
func NewLagSampler(client redis.UniversalClient, group string, interval time.Duration, logger watermill.LoggerAdapter) *LagSampler {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	if interval <= 0 {
		interval = DefaultLagInterval
	}
	l := &LagSampler{
		client:   client,
		group:    group,
		interval: interval,
		logger:   logger,
		samples:  make(map[string]LagInfo),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go l.run()
	return l
}

// Track adds stream to the sampled set (again is a no-op) and asks for a
// sample soon.
func (l *LagSampler) Track(stream string) {
	l.mu.Lock()
	for _, s := range l.streams {
		if s == stream {
			l.mu.Unlock()
			return
		}
	}
	l.streams = append(l.streams, stream)
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Samples returns the latest sample of every tracked stream that has one,
// sorted by stream.
func (l *LagSampler) Samples() []LagInfo {
	l.mu.Lock()
	out := make([]LagInfo, 0, len(l.samples))
	for _, s := range l.samples {
		out = append(out, s)
	}
	l.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out
}

// Backlog returns the sum of [LagInfo.Backlog] over the latest samples, and
// false while no stream has been sampled yet. Use it as a pressure signal:
// it grows when the group falls behind its producers.
func (l *LagSampler) Backlog() (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sum int64
	for _, s := range l.samples {
		sum += s.Backlog()
	}
	return sum, len(l.samples) > 0
}

// TotalLag is Backlog without the flag (0 before the first sample), so a
// LagSampler can serve as a producer.LagReader.
func (l *LagSampler) TotalLag() int64 {
	n, _ := l.Backlog()
	return n
}

// Close stops the sampler and waits for its goroutine. It is idempotent.
func (l *LagSampler) Close() {
	l.closeOnce.Do(func() { close(l.stop) })
	<-l.done
}

func (l *LagSampler) run() {
	defer close(l.done)
	t := time.NewTicker(l.interval)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		case <-l.kick:
		}
		l.sample(ctx)
	}
}

func (l *LagSampler) sample(ctx context.Context) {
	l.mu.Lock()
	streams := append([]string(nil), l.streams...)
	l.mu.Unlock()
	for _, stream := range streams {
		sctx, cancel := context.WithTimeout(ctx, l.interval)
		info, err := Lag(sctx, l.client, stream, l.group)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				l.logger.Debug("Lag sample failed", watermill.LogFields{"stream": stream, "group": l.group, "err": err.Error()})
			}
			continue
		}
		l.mu.Lock()
		l.samples[stream] = info
		l.mu.Unlock()
	}
}

// LagSource adapts the subscriber to telemetry.LagSource, for the shared
// telemetry.LagSampler (metrics, shedding, producer throttling): one sample
// per topic subscribed so far, Partition -1, Lag = [LagInfo.Backlog]
// (undelivered plus pending, the counterpart of Kafka's high-water mark
// minus the committed offset, which also counts in-flight messages). One
// XINFO GROUPS per topic per call; an error on any topic fails the sample.
func (s *Subscriber) LagSource() telemetry.LagSource {
	return telemetry.LagSourceFunc(func(ctx context.Context) ([]telemetry.LagSample, error) {
		s.mu.Lock()
		topics := make([]string, 0, len(s.topics))
		for t := range s.topics {
			topics = append(topics, t)
		}
		s.mu.Unlock()
		sort.Strings(topics)
		out := make([]telemetry.LagSample, 0, len(topics))
		for _, t := range topics {
			info, err := s.Lag(ctx, t)
			if err != nil {
				return nil, err
			}
			out = append(out, telemetry.LagSample{Topic: t, Group: s.cfg.ConsumerGroup, Partition: -1, Lag: info.Backlog()})
		}
		return out, nil
	})
}
