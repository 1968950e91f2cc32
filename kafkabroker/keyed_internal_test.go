package kafkabroker

import (
	"fmt"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/spillway-go/spillway/internal/kafkatest"
)

// pauseRecorder is a consumer group that records Pause and Resume.
type pauseRecorder struct {
	sarama.ConsumerGroup
	calls []string
}

func (r *pauseRecorder) Pause(parts map[string][]int32) {
	r.calls = append(r.calls, fmt.Sprint("pause ", parts))
}

func (r *pauseRecorder) Resume(parts map[string][]int32) {
	r.calls = append(r.calls, fmt.Sprint("resume ", parts))
}

// A partition reads ahead of its window: a record waiting for room does
// not pause it, a full read-ahead does (in records or in bytes), and it
// resumes once the read-ahead is down to half, so that the next fetch
// comes before the window runs dry.
func TestKeyReadAheadPausesWithHysteresis(t *testing.T) {
	group := &pauseRecorder{}
	p := &keyPartition{
		h:     &keyHandler{group: group},
		topic: "t", partition: 2,
		w: newKeyWindow[*keyDelivery](4, 1000, 0),
	}
	rec := func(size int) *sarama.ConsumerMessage {
		return &sarama.ConsumerMessage{Value: make([]byte, size)}
	}
	step := func(what string, want string) {
		t.Helper()
		p.pauseIfFull()
		got := ""
		if len(group.calls) > 0 {
			got = group.calls[len(group.calls)-1]
		}
		group.calls = group.calls[:0]
		if got != want {
			t.Errorf("%s: got %q, want %q", what, got, want)
		}
	}

	// The window is full (count == maxMsgs) and records wait: reading goes on.
	p.w.count = p.w.maxMsgs
	for range 10 {
		p.readAhead(rec(1))
	}
	step("10 records waiting for a full window", "")
	limit := readAheadFactor * p.w.maxMsgs // 128
	for len(p.w.ahead) < limit-1 {
		p.readAhead(rec(1))
	}
	step("one record short of the read-ahead", "")
	p.readAhead(rec(1))
	step("a full read-ahead", "pause map[t:[2]]")
	step("still full", "")

	drop := func(n int) {
		for range n {
			p.w.aheadBytes -= p.w.ahead[0].size
			p.w.ahead = p.w.ahead[1:]
		}
	}
	drop(limit/2 - 1)
	step("read-ahead above half", "")
	drop(1)
	step("read-ahead down to half", "")
	drop(1)
	step("read-ahead below half", "resume map[t:[2]]")

	// Bytes: a few large records fill it as well.
	drop(len(p.w.ahead))
	p.readAhead(rec(600))
	step("600 of 1000 bytes", "")
	p.readAhead(rec(400))
	step("1000 of 1000 bytes", "pause map[t:[2]]")
	drop(1)
	step("400 bytes left, below half", "resume map[t:[2]]")
}

// sessionRecorder is a consumer-group session that counts Commit calls.
type sessionRecorder struct {
	sarama.ConsumerGroupSession
	commits int
}

func (s *sessionRecorder) Commit()             { s.commits++ }
func (s *sessionRecorder) MemberID() string    { return "member" }
func (s *sessionRecorder) GenerationID() int32 { return 1 }

// A watermark that moved is committed through the session's offset
// manager when the commit client cannot commit it (here: closed), and one
// that did not move is not committed at all.
func TestKeyCommitFallsBackToSession(t *testing.T) {
	broker := kafkatest.Start(t, 1)
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_3_0_0
	client, err := sarama.NewClient(broker.Brokers(), conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	sess := &sessionRecorder{}
	ks := &keySession{sess: sess, h: &keyHandler{
		s:       &keySubscriber{logger: watermill.NopLogger{}},
		topic:   "t",
		commits: &committer{client: client, group: "g", conf: conf},
	}}
	p := &keyPartition{partition: 0}
	p.committed.Store(5)

	ks.commit([]*keyPartition{p}, []int64{5})
	if sess.commits != 0 {
		t.Fatalf("a watermark that did not move was committed %d times", sess.commits)
	}
	if err := ks.h.commits.commit(sess, "t", map[int32]int64{0: 9}); err == nil {
		t.Fatal("a commit on a closed client succeeded")
	}
	ks.commit([]*keyPartition{p}, []int64{9})
	if sess.commits != 1 {
		t.Fatalf("the session committed %d times after the commit client failed, want 1", sess.commits)
	}
}
