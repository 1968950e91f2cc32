package redisbroker

import (
	"context"
	"crypto/sha1" //nolint:gosec // Redis names scripts by their SHA-1
	"encoding/hex"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
)

// Subscribe loads the ack script in a pipeline without touching the
// hash the acks call it by: an empty hash made every ack fall back from
// EVALSHA to EVAL (about ten allocations per message more).
func TestSubscribeKeepsTheAckScriptHash(t *testing.T) {
	srv := redistest.Start(t)
	sum := sha1.Sum([]byte(ackScriptSource)) //nolint:gosec // see the import
	want := hex.EncodeToString(sum[:])
	if got := ackScript.Hash(); got != want {
		t.Fatalf("ackScript hash before Subscribe = %q, want %q", got, want)
	}
	sub, err := NewSubscriber(Config{Addr: srv.Addr(), ConsumerGroup: "g", Consumer: "c", Consumers: 2, BlockTime: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := sub.Subscribe(ctx, "script-hash"); err != nil {
		t.Fatal(err)
	}
	if got := ackScript.Hash(); got != want {
		t.Fatalf("ackScript hash after Subscribe = %q, want %q", got, want)
	}
	// And the server has it: the acks' EVALSHA finds it.
	exists, err := sub.control.ScriptExists(ctx, want).Result()
	if err != nil || len(exists) != 1 || !exists[0] {
		t.Fatalf("SCRIPT EXISTS %s = %v, %v; want true", want, exists, err)
	}
}
