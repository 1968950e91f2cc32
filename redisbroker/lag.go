package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Errors of [Subscriber.Lag] on a stream or group that does not exist.
var (
	errNoStream = errors.New("redisbroker: no such stream")
	errNoGroup  = errors.New("redisbroker: no such consumer group")
)

// lagInfo is a consumer group's position in one stream, from XINFO GROUPS
// (Redis 7 or later for Lag and EntriesRead).
type lagInfo struct {
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
func (l lagInfo) backlog() int64 { return max(l.Lag, 0) + l.Pending }

// readLag reads the position of group in stream with one XINFO GROUPS. It
// returns an error wrapping errNoStream or errNoGroup when either is missing.
func readLag(ctx context.Context, client redis.UniversalClient, stream, group string) (lagInfo, error) {
	groups, err := client.XInfoGroups(ctx, stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return lagInfo{}, fmt.Errorf("%w: %q", errNoStream, stream)
		}
		return lagInfo{}, fmt.Errorf("redisbroker: XINFO GROUPS %q: %w", stream, err)
	}
	for _, g := range groups {
		if g.Name == group {
			return lagInfo{
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
	return lagInfo{}, fmt.Errorf("%w: %q on stream %q", errNoGroup, group, stream)
}
