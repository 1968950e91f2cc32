package kafkatest_test

import (
	"net"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/kafkatest"
)

// The broker answers on its address while it runs and not after Kill.
func TestStartAndKill(t *testing.T) {
	b := kafkatest.Start(t, 2, "a", "b")
	addrs := b.Brokers()
	if len(addrs) == 0 {
		t.Fatal("no broker address")
	}
	c, err := net.DialTimeout("tcp", addrs[0], 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addrs[0], err)
	}
	c.Close()
	b.Kill()
	if c, err := net.DialTimeout("tcp", addrs[0], time.Second); err == nil {
		c.Close()
		t.Fatalf("%s still answers after Kill", addrs[0])
	}
}
