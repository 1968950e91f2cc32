// Command spillway-kafka runs an embedded Kafka broker (kfake) as a process
// of its own, for local development and for tests that need a broker they
// can kill.
//
//	spillway-kafka -partitions 12 -topics parcels,positions
//
// It prints one line, "brokers host:port[,host:port]", once the broker
// listens, and runs until SIGINT or SIGTERM, or until its standard input is
// closed when -stdin is set (so a parent that dies takes it along).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spillway-go/spillway/embedded"
)

func main() {
	partitions := flag.Int("partitions", 12, "partitions of each topic")
	topics := flag.String("topics", "", "comma-separated topics to create up front")
	stdin := flag.Bool("stdin", false, "exit when standard input is closed")
	flag.Parse()

	var list []string
	for t := range strings.SplitSeq(*topics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			list = append(list, t)
		}
	}
	k, err := embedded.StartKafka(int32(*partitions), list...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "spillway-kafka:", err)
		os.Exit(1)
	}
	defer k.Close()
	fmt.Println("brokers", strings.Join(k.Brokers(), ","))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *stdin {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			stop()
		}()
	}
	<-ctx.Done()
}
