package kafkabroker

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// ErrNotKafkaListener matches a connection error from an address that
// does not answer as a Kafka broker: kafka.brokers names something else,
// such as an HTTP or Redis port. An HTTP server's reply reaches Sarama as
// "message of length 1213486160 too large" (the reply's first four bytes,
// "HTTP", read as a length); a Redis server does not reply at all.
var ErrNotKafkaListener = errors.New("kafkabroker: the address does not answer as a Kafka broker")

// probeTimeout bounds how long [probe] waits for a broker's reply. A
// Kafka broker answers ApiVersions at once; the clients' own read timeout
// is the rebalance timeout plus 5 s, for JoinGroup, so without the probe
// a silent address would hold New for minutes.
const probeTimeout = 5 * time.Second

// probe asks each broker for its API versions, with sc's network settings
// (TLS, SASL) and a short read timeout. It returns nil as soon as one
// answers, or when none answers for another reason than not speaking
// Kafka (a refused connection: Sarama reports that itself). Otherwise it
// returns the error of the first broker that answered with something else,
// or not at all, wrapped with [ErrNotKafkaListener] and a hint naming the
// addresses.
func probe(brokers []string, sc *sarama.Config) error {
	conf := *sc
	conf.Net.ReadTimeout = min(conf.Net.ReadTimeout, probeTimeout)
	// The probe's own ApiVersions request is the only one: with Sarama's
	// handshake on, Open sends it too (and again at a lower version when
	// the first gets no reply), tripling the wait on a silent address.
	conf.ApiVersionsRequest = false
	var (
		first error
		bad   []string
	)
	for _, addr := range brokers {
		b := sarama.NewBroker(addr)
		err := b.Open(&conf)
		if err == nil {
			_, err = b.ApiVersions(&sarama.ApiVersionsRequest{})
		}
		_ = b.Close()
		if err == nil {
			return nil
		}
		if notKafka(err) {
			bad = append(bad, addr)
			if first == nil {
				first = err
			}
		}
	}
	if first == nil {
		return nil
	}
	return listenerHint(first, bad)
}

// notKafka reports whether err says that the address was reached but did
// not answer as Kafka: a reply Sarama cannot decode, or no reply before
// the read timed out.
func notKafka(err error) bool {
	var pde sarama.PacketDecodingError
	if errors.As(err, &pde) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "read" && op.Timeout()
}

// listenerHint returns err, from connecting to brokers, wrapped with
// [ErrNotKafkaListener] and a hint naming the addresses when the reply was
// not Kafka's (see notKafka); any other error is returned as it is.
func listenerHint(err error, brokers []string) error {
	if err == nil || !notKafka(err) {
		return err
	}
	hint := "is " + strings.Join(brokers, " or ") + " a Kafka listener?"
	if len(brokers) > 1 {
		hint = "are " + strings.Join(brokers, ", ") + " Kafka listeners?"
	}
	var (
		pde sarama.PacketDecodingError
		n   int64
	)
	switch {
	case !errors.As(err, &pde):
		hint += " It did not reply within " + probeTimeout.String() + "."
	case fmtScan(pde.Info, &n) && n > 0 && n <= 1<<31-1:
		if b := []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}; printable(b) {
			hint += " Its reply began with " + strconv.Quote(string(b)) + "."
		}
	}
	return fmt.Errorf("%w: %s Check kafka.brokers: %w", ErrNotKafkaListener, hint, err)
}

// fmtScan reads the length out of Sarama's "message of length N too
// large or too small".
func fmtScan(info string, n *int64) bool {
	_, err := fmt.Sscanf(info, "message of length %d", n)
	return err == nil
}

// printable reports whether b is printable ASCII.
func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}
