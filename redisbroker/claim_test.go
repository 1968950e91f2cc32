package redisbroker_test

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
)

// cutProxy forwards TCP connections to a target until it is cut: from then
// on it forwards nothing in either direction and keeps the connections
// open, as a network partition does. heal closes the connections it cut and
// forwards new ones again. It can also hold back every reply for a while
// (delayReplies), as a slow network does.
type cutProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex // held while forwarding a chunk, so cut stops at once
	cut    bool
	delay  time.Duration // of every chunk from the target
	closed bool
	conns  []net.Conn
}

func startCutProxy(t testing.TB, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) Addr() string { return p.ln.Addr().String() }

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = u.Close()
			return
		}
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(u, c, false) })
		p.wg.Go(func() { p.pipe(c, u, true) })
	}
}

// pipe copies src to dst while the proxy is not cut; once cut, what src
// sends is lost. Replies (from the target) are held back by delay.
func (p *cutProxy) pipe(dst, src net.Conn, replies bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if replies {
				p.mu.Lock()
				d := p.delay
				p.mu.Unlock()
				time.Sleep(d)
			}
			p.mu.Lock()
			var werr error
			if !p.cut {
				_, werr = dst.Write(buf[:n])
			}
			p.mu.Unlock()
			if werr != nil {
				_ = src.Close()
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// delayReplies holds back every reply from the target by d from now on.
func (p *cutProxy) delayReplies(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// partition stops forwarding; when it returns, no byte passes any more.
func (p *cutProxy) partition() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
}

// heal ends the partition: the connections it cut are closed (what they
// carried is lost) and new ones are forwarded.
func (p *cutProxy) heal() {
	p.mu.Lock()
	conns := p.conns
	p.conns, p.cut = nil, false
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (p *cutProxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}

// starts records when each message started on one subscriber.
type starts struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (s *starts) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at == nil {
		s.at = make(map[string][]time.Time)
	}
	s.at[id] = append(s.at[id], time.Now())
}

func (s *starts) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id := range s.at {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func (s *starts) first(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.at[id]) == 0 {
		return time.Time{}, false
	}
	return s.at[id][0], true
}

// A consumer cut off from Redis (a proxy in front of redis-server stops
// forwarding) holds one message in its handler and two read ahead. Its
// peer claims all three once they have been idle for MaxIdleTime. The
// cut-off consumer revokes the one in its handler before the peer can
// claim it (measured against Redis's own idle clock), and when its handler
// returns it starts neither read-ahead entry: they run on the peer only.
// Before the cut its replies are slowed down by more than the margin the
// keep-alive keeps, so revoking in time requires measuring from when the
// last refresh was sent, not from when its reply came.
func TestCutOffConsumerStartsNothingAPeerCanClaim(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := testConfig(srv)
	cfg.Consumers = 1
	cfg.BlockTime = 20 * time.Millisecond
	cfg.ClaimInterval = 50 * time.Millisecond
	cfg.MaxIdleTime = 3 * time.Second // keep-alive every second; given up 150 ms before a claim
	topic := uniq("cut")
	publish(t, newPublisher(t, cfg), topic, "m1", "m2", "m3")

	proxy := startCutProxy(t, srv.Addr())
	cutCfg := cfg
	cutCfg.Addr = proxy.Addr()
	cut := newSubscriber(t, cutCfg)
	t.Cleanup(proxy.heal) // before cut closes: its queued acks can go out

	var onCut, onPeer starts
	revoked := make(chan time.Time, 1)
	release := make(chan struct{})
	cutMsgs := subscribe(t, cut, topic)
	go func() {
		for msg := range cutMsgs {
			onCut.add(msg.UUID)
			if msg.UUID == "m1" {
				select {
				case <-cut.Revoked(msg):
					revoked <- time.Now()
				case <-release:
				}
				<-release
			}
			cut.Completed(msg)
			msg.Ack()
		}
	}()
	waitFor(t, "the cut-off consumer to hold m1 and two read ahead", 15*time.Second, func() bool {
		return cut.Stats().Tracked == 3 && len(onCut.ids()) == 1
	})

	peerCfg := cfg
	peerCfg.Consumer = uniq("peer")
	peer := newSubscriber(t, peerCfg)
	peerMsgs := subscribe(t, peer, topic)
	go func() {
		for msg := range peerMsgs {
			onPeer.add(msg.UUID)
			msg.Ack()
		}
	}()

	waitFor(t, "a first refresh", 15*time.Second, func() bool { return cut.Stats().Refreshed >= 3 })
	proxy.delayReplies(300 * time.Millisecond)
	waitFor(t, "a refresh answered late", 15*time.Second, func() bool { return cut.Stats().Refreshed >= 6 })
	proxy.partition()
	// Redis's idle clock of m1 says when a peer may claim it: no sooner
	// than MaxIdleTime after its last refresh reached Redis.
	time.Sleep(100 * time.Millisecond)
	c := rawClient(t, srv)
	pending, err := c.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: topic, Group: cfg.ConsumerGroup, Start: "-", End: "+", Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 3 {
		t.Fatalf("pending after the cut: %+v, want m1..m3", pending)
	}
	claimable := time.Now().Add(cfg.MaxIdleTime - pending[0].Idle) // m1 has the lowest ID

	waitFor(t, "the peer to claim and run m1..m3", 20*time.Second, func() bool { return len(onPeer.ids()) == 3 })
	close(release)
	time.Sleep(500 * time.Millisecond) // the cut-off consumer's upstream hands over what it read ahead

	if got := onCut.ids(); !slices.Equal(got, []string{"m1"}) {
		t.Errorf("the cut-off consumer started %v after the peer had claimed m2 and m3; want only m1, started before the cut", got)
	}
	select {
	case at := <-revoked:
		if !at.Before(claimable) {
			t.Errorf("m1 revoked %v after a peer could claim it; want before", at.Sub(claimable))
		} else {
			t.Logf("m1 revoked %v before a peer could claim it", claimable.Sub(at))
		}
	default:
		t.Error("m1 was not revoked on the cut-off consumer before the peer had run m1..m3")
	}
	if peerStart, _ := onPeer.first("m1"); peerStart.Before(claimable.Add(-20 * time.Millisecond)) {
		t.Errorf("the peer ran m1 %v before Redis let it claim it: the test's clock is off", claimable.Sub(peerStart))
	}
}

// redis-server is killed (AOF on) mid-burst for longer than MaxIdleTime,
// then restarted. Acks given during the outage wait in each subscriber's
// acker, and every pending entry is past MaxIdleTime when Redis is back:
// a subscriber's own claim loop must not take back an entry whose ack it
// still holds, so no message runs twice on the subscriber that finished
// it. A peer subscriber may claim such an entry before the ack lands (the
// ack is then refused, the peer runs it again): that is at-least-once
// delivery across subscribers, and is only logged here.
func TestOutageLongerThanMaxIdleRedoesNothingOnTheSameSubscriber(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	cfg := testConfig(srv)
	cfg.BlockTime = 20 * time.Millisecond
	cfg.ClaimInterval = 20 * time.Millisecond
	cfg.MaxIdleTime = time.Second
	topic := uniq("outage")

	type run struct{ sub, id string }
	var (
		mu   sync.Mutex
		runs = make(map[run]int)
		done = make(map[string]bool)
	)
	for _, name := range []string{"a", "b"} {
		scfg := cfg
		scfg.Consumer = uniq(name)
		sub := newSubscriber(t, scfg)
		runRouter(t, sub, topic, func(msg *message.Message) error {
			mu.Lock()
			runs[run{name, msg.UUID}]++
			mu.Unlock()
			time.Sleep(30 * time.Millisecond)
			mu.Lock()
			done[msg.UUID] = true
			mu.Unlock()
			return nil
		})
	}
	finished := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(done)
	}
	want := ids("o", 150)
	publish(t, newPublisher(t, cfg), topic, want...)
	waitFor(t, "a third of the burst", 60*time.Second, func() bool { return finished() >= len(want)/3 })
	srv.Kill()
	time.Sleep(cfg.MaxIdleTime + 1500*time.Millisecond)
	srv.Restart()
	waitFor(t, "the whole burst", 90*time.Second, func() bool { return finished() == len(want) })
	time.Sleep(2 * cfg.MaxIdleTime) // anything claimed late runs now

	mu.Lock()
	defer mu.Unlock()
	across := 0
	for _, id := range want {
		for _, sub := range []string{"a", "b"} {
			if n := runs[run{sub, id}]; n > 1 {
				t.Errorf("%s ran %d times on subscriber %s, which had finished it", id, n, sub)
			}
		}
		if runs[run{"a", id}] > 0 && runs[run{"b", id}] > 0 {
			across++
		}
	}
	t.Logf("%d of %d messages ran on both subscribers (a peer claimed them before the finisher's ack landed)", across, len(want))
}
