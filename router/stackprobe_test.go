//go:build stackprobe

package router

import (
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/internal/redistest"
)

// BenchmarkStackHighWater measures how deep the default stack reaches into
// the message goroutine's stack with internal/stackroom's growth switched
// off (the stackprobe build tag), on the brokers whose layers differ: the
// memory broker, Kafka (watermill-kafka's subscriber and the session
// tracker, or key mode) and Redis (its dead-letter layer and the
// keep-alive's tracker), with telemetry on (no providers installed: the
// global placeholders) and off. It reports the median and the deepest
// depth over b.N pings, and stackprobe.Room, the depth past which the
// runtime must grow (copy) a new goroutine's 2 KiB stack:
//
//	go test -tags stackprobe -run '^$' -bench StackHighWater -benchtime 2000x ./router/
//
// With -v it also logs the path to the median depth (stackprobe.Probe.Path).
func BenchmarkStackHighWater(b *testing.B) {
	kafka := kafkatest.Start(b, 4)
	for _, c := range []struct {
		name     string
		broker   Broker
		key      bool
		disabled bool
	}{
		{"memory/telemetry=on", BrokerMemory, false, false},
		{"memory/telemetry=off", BrokerMemory, false, true},
		{"kafka/consumer=partition/telemetry=on", BrokerKafka, false, false},
		{"kafka/consumer=partition/telemetry=off", BrokerKafka, false, true},
		{"kafka/consumer=key/telemetry=on", BrokerKafka, true, false},
		{"redis/telemetry=on", BrokerRedis, false, false},
		{"redis/telemetry=off", BrokerRedis, false, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := Config{Broker: c.broker}
			cfg.Telemetry.Disabled = c.disabled
			if c.broker == BrokerKafka {
				probeKafka(&cfg, kafka.Brokers(), 4)
				if c.key {
					cfg.Kafka.Consumer = "key"
				}
			}
			if c.broker == BrokerRedis {
				cfg.Redis.Addr = redistest.Start(b).Addr()
				cfg.Redis.BlockTime = 50 * time.Millisecond
			}
			runProbed(b, cfg, b.N, nil).Report(b)
			b.ReportMetric(0, "ns/op")
		})
	}
}
