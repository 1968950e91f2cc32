package scaling

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-go/spillway/cmd/internal/redisproc"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/embedded"
)

// ErrNoRedisServer says why the Redis part of a sweep is skipped.
var ErrNoRedisServer = errors.New("redis-server is not on PATH (apt-get install redis-server): the Redis Streams part of the sweep is skipped")

// kafkaVersion is the protocol version every client speaks: the newest
// Sarama and kfake agree on (the router's choice for an embedded
// broker, docs/kafka.md).
var kafkaVersion = sarama.V2_3_0_0

// childEnv carries the child broker's partitions and topics,
// "<partitions>:<topic>,<topic>...". A process started with it set serves
// a kfake broker instead of doing anything else ([ServeBrokerIfAsked]).
const childEnv = "SPILLWAY_BENCH_KAFKA_CHILD"

// ServeBrokerIfAsked runs the embedded Kafka broker of a sweep when this
// process was started as one (the sweep starts its own executable with a
// variable set), and returns true when it has finished; it returns false at
// once otherwise. Call it first thing in main, and in TestMain of a test
// binary that runs a sweep: the broker then runs in a process of its own,
// so the CPU and heap measured are the consumer's alone.
func ServeBrokerIfAsked() bool {
	spec, ok := os.LookupEnv(childEnv)
	if !ok {
		return false
	}
	parts, topics, _ := strings.Cut(spec, ":")
	p, err := strconv.Atoi(parts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "spillway bench broker:", err)
		os.Exit(1)
	}
	k, err := embedded.StartKafka(int32(p), strings.Split(topics, ",")...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "spillway bench broker:", err)
		os.Exit(1)
	}
	fmt.Println("brokers", strings.Join(k.Brokers(), ","))
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it or dies
	k.Close()
	return true
}

// kafkaChild is a kfake broker in a child process.
type kafkaChild struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	brokers []string
}

func startKafkaChild(partitions int, topics []string) (*kafkaChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("scaling: finding this executable to run the broker: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(partitions)+":"+strings.Join(topics, ","))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("scaling: starting the Kafka broker process: %w", err)
	}
	c := &kafkaChild{cmd: cmd, stdin: stdin}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(l)
		_, _ = io.Copy(io.Discard, out)
	}()
	var first string
	select {
	case first = <-line:
	case <-time.After(30 * time.Second):
	}
	addrs, found := strings.CutPrefix(first, "brokers ")
	if !found || addrs == "" {
		c.close()
		return nil, fmt.Errorf("scaling: the Kafka broker process did not start (first line %q)", first)
	}
	c.brokers = strings.Split(addrs, ",")
	return c, nil
}

func (c *kafkaChild) close() {
	_ = c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// publishKafka writes msgs to topic in batches, with nil keys (Sarama's
// hash partitioner then spreads them over the partitions at random).
func publishKafka(brokers []string, topic string, msgs []*message.Message) error {
	c := kafka.DefaultSaramaSyncPublisherConfig()
	c.Version = kafkaVersion
	// Producer.MaxMessageBytes stays at Sarama's 1 MB, which also caps a
	// record batch: the broker's limit.
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	p, err := sarama.NewSyncProducer(brokers, c)
	if err != nil {
		return fmt.Errorf("scaling: producer: %w", err)
	}
	defer p.Close()
	m := kafka.DefaultMarshaler{}
	const batch = 200
	for i := 0; i < len(msgs); i += batch {
		pm := make([]*sarama.ProducerMessage, 0, batch)
		for _, msg := range msgs[i:min(i+batch, len(msgs))] {
			km, err := m.Marshal(topic, msg)
			if err != nil {
				return err
			}
			pm = append(pm, km)
		}
		if err := p.SendMessages(pm); err != nil {
			var pe sarama.ProducerErrors
			if errors.As(err, &pe) && len(pe) > 0 {
				err = fmt.Errorf("%w (first: %w)", err, pe[0].Err)
			}
			return fmt.Errorf("scaling: publishing to %s: %w", topic, err)
		}
	}
	return nil
}

// redisServer is a real redis-server on a free loopback port, without
// persistence.
type redisServer struct {
	*redisproc.Server
	addr   string
	client *redis.Client
}

func startRedis() (*redisServer, error) {
	srv, err := redisproc.Start("spillway-bench-redis-", "--maxclients", "4096")
	if errors.Is(err, redisproc.ErrNotFound) {
		return nil, ErrNoRedisServer
	}
	if err != nil {
		return nil, fmt.Errorf("scaling: %w", err)
	}
	return &redisServer{Server: srv, addr: srv.Addr, client: srv.Client}, nil
}

// flush empties the server between cells.
func (s *redisServer) flush(ctx context.Context) error { return s.client.FlushAll(ctx).Err() }

func (s *redisServer) close() { s.Close() }

// publishRedis appends msgs to the stream topic in pipelined batches, in
// watermill-redisstream's encoding.
func (s *redisServer) publish(ctx context.Context, topic string, msgs []*message.Message) error {
	m := redisstream.DefaultMarshallerUnmarshaller{}
	const batch = 200
	for i := 0; i < len(msgs); i += batch {
		pipe := s.client.Pipeline()
		for _, msg := range msgs[i:min(i+batch, len(msgs))] {
			values, err := m.Marshal(topic, msg)
			if err != nil {
				return err
			}
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: values})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("scaling: publishing to %s: %w", topic, err)
		}
	}
	return nil
}
