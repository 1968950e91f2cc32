package kafkabroker_test

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/spillway-go/spillway/kafkabroker"
)

// httpListener answers every connection with an HTTP response, as a web
// server would to a Kafka client.
func httpListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Read(make([]byte, 512))
				_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
				_, _ = c.Read(make([]byte, 1)) // until the client hangs up
			}()
		}
	}()
	return ln.Addr().String()
}

// kafka.brokers naming an HTTP port fails within seconds with a hint that
// names the address, and the Sarama error still wrapped.
func TestNotAKafkaListener(t *testing.T) {
	addr := httpListener(t)
	cl, err := kafkabroker.New(kafkabroker.Config{Brokers: []string{addr}, Consumer: kafkabroker.ConsumerKey})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for name, connect := range map[string]func() error{
		"publisher": func() error { _, err := cl.NewPublisher(); return err },
		"admin":     func() error { _, err := cl.Client(); return err },
		"key subscriber": func() error {
			sub, _, err := cl.NewSubscriber("g")
			if err != nil {
				return err
			}
			defer sub.Close()
			_, err = sub.Subscribe(t.Context(), "t")
			return err
		},
	} {
		start := time.Now()
		err := connect()
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("%s: took %v", name, took)
		}
		var pde sarama.PacketDecodingError
		if !errors.Is(err, kafkabroker.ErrNotKafkaListener) || !errors.As(err, &pde) {
			t.Errorf("%s: %v, want ErrNotKafkaListener wrapping Sarama's decoding error", name, err)
			continue
		}
		for _, want := range []string{"is " + addr + " a Kafka listener?", `began with "HTTP"`, "1213486160"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q lacks %q", name, err, want)
			}
		}
	}
}

// A refused connection is not given the hint: nothing answered.
func TestRefusedIsNotAListenerProblem(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cl, err := kafkabroker.New(kafkabroker.Config{Brokers: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, err = cl.NewPublisher()
	if err == nil || errors.Is(err, kafkabroker.ErrNotKafkaListener) {
		t.Errorf("NewPublisher = %v, want a connection error without the hint", err)
	}
}
