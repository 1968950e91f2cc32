// Command consumer is a Spillway consumer that internal/crashtest runs as a
// process of its own, so that tests can kill it (kill -9) or stop it
// (SIGTERM) mid-burst the way an orchestrator would.
//
// It runs a router from a YAML config file with one handler on one topic.
// The handler journals each message it starts ("S id vertices") and each it
// finishes ("D id"), one write per line to a file opened for appending, so a
// line written before the process dies survives it. Work is a sleep
// proportional to the message's vertex_count. It prints "ready" on standard
// output once the router runs, and exits 0 after a graceful shutdown. Every
// 100 ms it samples the heap and journals a new peak as "H bytes".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/router"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// sampleHeap journals the peak of the live heap ("H bytes") whenever it
// rises, sampled every 100 ms.
func sampleHeap(write func(string)) {
	var peak uint64
	var ms runtime.MemStats
	for range time.Tick(100 * time.Millisecond) {
		runtime.ReadMemStats(&ms)
		if ms.HeapAlloc > peak {
			peak = ms.HeapAlloc
			write(fmt.Sprintf("H %d\n", peak))
		}
	}
}

func run() error {
	config := flag.String("config", "", "router config `file` (YAML)")
	topic := flag.String("topic", "parcels", "topic to consume")
	journal := flag.String("journal", "", "journal `file` (appended)")
	perVertex := flag.Duration("per-vertex", 0, "handler time per vertex")
	failOn := flag.String("fail-on", "", "the handler fails every message whose payload contains this")
	output := flag.String("output", "", "a topic the handler publishes one message to per message it finishes (Watermill publishes it after the handler returns)")
	decode := flag.Bool("decode", false, "the handler decodes the payload as geometry and fails when it cannot")
	verbose := flag.Bool("v", false, "log the router at debug level to standard error")
	flag.Parse()
	if *config == "" || *journal == "" {
		return fmt.Errorf("-config and -journal are required")
	}
	cfg, err := router.LoadConfig(*config)
	if err != nil {
		return err
	}
	j, err := os.OpenFile(*journal, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer j.Close()
	write := func(line string) {
		if _, err := j.WriteString(line); err != nil {
			fmt.Fprintln(os.Stderr, "consumer: journal:", err)
		}
	}

	// Errors and info go to standard error (the harness shows its tail
	// when a test fails); -v adds debug.
	logger := watermill.NewStdLoggerWithOut(os.Stderr, *verbose, false)
	r, err := router.New(cfg, logger, router.WithSignals())
	if err != nil {
		return err
	}
	handle := func(msg *message.Message) ([]*message.Message, error) {
		n, _ := strconv.ParseInt(msg.Metadata.Get("vertex_count"), 10, 64)
		write(fmt.Sprintf("S %s %d\n", msg.UUID, n))
		if *failOn != "" && strings.Contains(string(msg.Payload), *failOn) {
			write(fmt.Sprintf("F %s\n", msg.UUID))
			return nil, fmt.Errorf("poison payload")
		}
		if *decode {
			if _, err := cost.Decode(msg.Payload); err != nil {
				write(fmt.Sprintf("F %s\n", msg.UUID))
				return nil, fmt.Errorf("decoding the payload: %w", err)
			}
		}
		// The work runs to its end whatever happens to the message's
		// context, as a real handler's CPU-bound work would.
		time.Sleep(time.Duration(n) * *perVertex)
		write(fmt.Sprintf("D %s\n", msg.UUID))
		if *output == "" {
			return nil, nil
		}
		out := message.NewMessage(watermill.NewUUID(), []byte(`{"type":"Point","coordinates":[0,0]}`))
		out.Metadata.Set("source", msg.UUID)
		return []*message.Message{out}, nil
	}
	if *output == "" {
		_, err = r.AddConsumerHandler("crash", *topic, func(msg *message.Message) error {
			_, err := handle(msg)
			return err
		})
	} else {
		_, err = r.AddHandler("crash", *topic, *output, handle)
	}
	if err != nil {
		return err
	}
	go func() {
		<-r.Running()
		fmt.Println("ready")
	}()
	go sampleHeap(write)
	return r.Run(context.Background())
}
