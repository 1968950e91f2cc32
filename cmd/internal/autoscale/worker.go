package autoscale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/spillway-go/spillway/cmd/internal/scaling"
	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/redisbroker"
	"github.com/spillway-go/spillway/router"
	"github.com/spillway-go/spillway/telemetry"
)

// workerEnv carries a worker's spec as JSON. A process started with it
// set is a consumer of the fleet ([ServeWorkerIfAsked]).
const workerEnv = "SPILLWAY_AUTOSCALE_WORKER"

// The kinds of worker.
const (
	KindSpillway = "spillway" // the Spillway router, with telemetry on a Prometheus endpoint
	KindPlain    = "plain"    // Watermill's router with the bare upstream subscriber
)

// handlerName is the one handler of every worker; the consumer group a
// worker consumes in is group + "." + handlerName, as the Spillway
// router names it.
const handlerName = "work"

// producedAtKey is the metadata key of a message's produce time (Unix
// nanoseconds).
const producedAtKey = "produced_at"

// kafkaVersion is the protocol version every client speaks, the router's
// choice for the embedded broker (docs/kafka.md).
var kafkaVersion = sarama.V2_3_0_0

// workerSpec is what a worker process is told.
type workerSpec struct {
	Kind   string   `json:"kind"`
	Broker string   `json:"broker"`
	Kafka  []string `json:"kafka,omitempty"`
	Redis  string   `json:"redis,omitempty"`
	Topic  string   `json:"topic"`
	// Group is the consumer group's prefix (the router's consumer_group).
	Group      string        `json:"group"`
	Partitions int32         `json:"partitions"`
	Budget     int64         `json:"budget"`
	SizeEvery  time.Duration `json:"size_every,omitempty"`
	Consumers  int           `json:"consumers"`
	Work       WorkModel     `json:"work"`
	LagEvery   time.Duration `json:"lag_every"`
	// Out is the file the worker appends one line per finished message to.
	Out string `json:"out"`
}

// WorkModel is the handler's cost: it waits on a downstream that serves
// Slots requests of each process at a time, each taking PerMessage plus
// PerVertex per vertex. Waiting, not computing, so that more processes
// add capacity on a machine of few cores.
type WorkModel struct {
	PerMessage time.Duration `json:"per_message"`
	PerVertex  time.Duration `json:"per_vertex"`
	Slots      int           `json:"slots"`
}

// cost is how long one message of v vertices takes.
func (w WorkModel) cost(v int) time.Duration {
	return w.PerMessage + time.Duration(v)*w.PerVertex
}

// VerticesPerSecond is one process's rate on messages of avgVertices
// vertices on average.
func (w WorkModel) VerticesPerSecond(avgVertices float64) float64 {
	per := w.PerMessage.Seconds() + avgVertices*w.PerVertex.Seconds()
	return float64(w.Slots) * avgVertices / per
}

// ServeWorkerIfAsked runs a consumer of the fleet when this process was
// started as one, until SIGTERM, and returns true when it has finished;
// it returns false at once otherwise. Call it first thing in main, and in
// TestMain of a test binary that runs the experiment.
func ServeWorkerIfAsked() bool {
	raw, ok := os.LookupEnv(workerEnv)
	if !ok {
		return false
	}
	var spec workerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "spillway bench autoscale worker:", err)
		os.Exit(1)
	}
	if err := runWorker(spec); err != nil {
		fmt.Fprintln(os.Stderr, "spillway bench autoscale worker:", err)
		os.Exit(1)
	}
	return true
}

// runWorker consumes until SIGTERM, then closes gracefully. The first
// line on stdout is "ready <metrics URL>" ("ready -" without metrics).
func runWorker(spec workerSpec) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	out, err := os.OpenFile(spec.Out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	h := newHandler(spec.Work, out)
	if spec.Kind == KindSpillway {
		return runSpillway(ctx, spec, h)
	}
	return runPlain(ctx, spec, h)
}

// handler is the worker's message handler: it takes a downstream slot,
// waits the message's cost and records it done.
type handler struct {
	work  WorkModel
	slots chan struct{}
	mu    sync.Mutex
	out   *os.File
	pid   int
}

func newHandler(w WorkModel, out *os.File) *handler {
	return &handler{work: w, slots: make(chan struct{}, max(w.Slots, 1)), out: out, pid: os.Getpid()}
}

func (h *handler) handle(msg *message.Message) error {
	v, err := strconv.Atoi(msg.Metadata.Get(cost.MetadataKey))
	if err != nil {
		return fmt.Errorf("message %s: %s: %w", msg.UUID, cost.MetadataKey, err)
	}
	h.slots <- struct{}{}
	time.Sleep(h.work.cost(v))
	<-h.slots
	line := fmt.Sprintf("%s %s %d %d\n", msg.UUID, msg.Metadata.Get(producedAtKey), time.Now().UnixNano(), h.pid)
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err = h.out.WriteString(line)
	return err
}

func runSpillway(ctx context.Context, spec workerSpec, h *handler) error {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

	var cfg router.Config
	cfg.ConsumerGroup = spec.Group
	cfg.CloseTimeout = 60 * time.Second
	cfg.Budget.Vertices = spec.Budget
	if spec.SizeEvery > 0 {
		// The drain rate is then the auto-sizer's throughput per busy
		// second: what the process drains while it has work, not what
		// it happened to admit in the last lag interval.
		cfg.Budget.AutoSize.Enabled = true
		cfg.Budget.AutoSize.Window = spec.SizeEvery
		cfg.Budget.AutoSize.Parallelism = max(spec.Work.Slots, 1) // the downstream's, not the cores'
		cfg.Budget.AutoSize.Ceiling = 2 * spec.Budget
	}
	cfg.Telemetry.LagInterval = spec.LagEvery
	switch spec.Broker {
	case BrokerKafka:
		cfg.Broker = "kafka"
		cfg.Kafka.Brokers = spec.Kafka
		cfg.Kafka.Version = kafkaVersion.String()
		cfg.Kafka.Partitions = spec.Partitions
	case BrokerRedis:
		cfg.Broker = "redis"
		cfg.Redis.Addr = spec.Redis
		cfg.Redis.Consumers = spec.Consumers
	}
	r, err := router.New(cfg, watermill.NopLogger{}, router.WithTelemetry(telemetry.WithMeterProvider(mp)))
	if err != nil {
		return err
	}
	if _, err := r.AddConsumerHandler(handlerName, spec.Topic, h.handle); err != nil {
		_ = r.Close()
		return err
	}
	fmt.Printf("ready http://%s/metrics\n", l.Addr())
	return r.Run(ctx)
}

func runPlain(ctx context.Context, spec workerSpec, h *handler) error {
	wm, err := message.NewRouter(message.RouterConfig{CloseTimeout: 60 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	group := spec.Group + "." + handlerName
	handle := func(msg *message.Message) error { return h.handle(msg) }
	switch spec.Broker {
	case BrokerKafka:
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:               spec.Kafka,
			Unmarshaler:           kafka.DefaultMarshaler{},
			OverwriteSaramaConfig: scaling.BareSaramaConfig(), // the Spillway router's kafka defaults
			ConsumerGroup:         group,
		}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		wm.AddConsumerHandler(handlerName, spec.Topic, sub, handle)
	case BrokerRedis:
		rc := redisbroker.Config{Addr: spec.Redis, ConsumerGroup: group}.WithDefaults()
		for i := range max(spec.Consumers, 1) {
			sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client:                        redis.NewClient(&redis.Options{Addr: spec.Redis}), // the subscriber closes it
				Consumer:                      fmt.Sprintf("plain-%d-%d", os.Getpid(), i),
				ConsumerGroup:                 group,
				NackResendSleep:               rc.NackResendSleep,
				BlockTime:                     rc.BlockTime,
				ClaimInterval:                 rc.ClaimInterval,
				MaxIdleTime:                   rc.MaxIdleTime,
				OldestId:                      "0",
				DisableIndefiniteInitialBlock: true, // so that Close returns
			}, watermill.NopLogger{})
			if err != nil {
				return err
			}
			wm.AddConsumerHandler(fmt.Sprintf("%s-%d", handlerName, i), spec.Topic, sub, handle)
		}
	default:
		return errors.New("unknown broker " + spec.Broker)
	}
	fmt.Println("ready -")
	err = wm.Run(ctx)
	if cerr := wm.Close(); err == nil {
		err = cerr
	}
	return err
}
