package gossipfault_test

import (
	"errors"
	"io"
	"log"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"keyway/internal/gossipfault"
	"keyway/internal/poll"
)

// node starts a memberlist node on 127.0.0.1 with quick failure
// detection; wrap, if non-nil, wraps its transport.
func node(t *testing.T, name string, wrap func(*memberlist.NetTransport) memberlist.NodeAwareTransport) (*memberlist.Memberlist, memberlist.NodeAwareTransport) {
	t.Helper()
	c := memberlist.DefaultLocalConfig()
	c.Name = name
	c.BindAddr, c.AdvertiseAddr = "127.0.0.1", "127.0.0.1"
	c.ProbeInterval, c.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	c.SuspicionMult, c.TCPTimeout = 2, time.Second
	c.GossipInterval = 50 * time.Millisecond
	c.LogOutput = io.Discard
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	c.BindPort = nt.GetAutoBindPort()
	c.AdvertisePort = c.BindPort
	var tr memberlist.NodeAwareTransport = nt
	if wrap != nil {
		tr = wrap(nt)
	}
	c.Transport = tr
	ml, err := memberlist.Create(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ml.Shutdown() })
	return ml, tr
}

func addr(ml *memberlist.Memberlist) string {
	n := ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Two real memberlist nodes: the cut one and its peer mark each other
// dead, cut dials time out instead of being refused, incoming streams are
// held silent, and after the heal a join merges them again.
func TestCutIsolatesANodeBothWays(t *testing.T) {
	sw := gossipfault.New()
	a, ta := node(t, "a", sw.Wrap)
	b, _ := node(t, "b", nil)
	if _, err := b.Join([]string{addr(a)}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "both nodes see 2 members", func() bool { return a.NumMembers() == 2 && b.NumMembers() == 2 })
	if s := sw.Dropped(); s != (gossipfault.Stats{}) {
		t.Fatalf("dropped %+v before any cut", s)
	}

	sw.Cut()
	poll.Until(t, 20*time.Second, "each node marks the other dead", func() bool { return a.NumMembers() == 1 && b.NumMembers() == 1 })

	// A dial from the cut node waits out its timeout and fails as a
	// timeout, the way a dropped SYN does, never as a refusal.
	start := time.Now()
	_, err := ta.DialTimeout(addr(b), 300*time.Millisecond)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("cut dial: %v, want a timeout error", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("cut dial failed after %s, before its 300ms timeout", d)
	}
	// A stream to the cut node connects (the kernel accepts it) and then
	// hears nothing: no answer, no EOF, no reset.
	conn, err := net.Dial("tcp", addr(a))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read from a held stream: %v, want a timeout", err)
	}
	poll.Until(t, 5*time.Second, "the held stream is counted", func() bool { return sw.Dropped().StreamsIn > 0 })
	s := sw.Dropped()
	if s.PacketsOut == 0 || s.PacketsIn == 0 || s.DialsOut == 0 {
		t.Fatalf("dropped %+v during the cut, want packets both ways and dials", s)
	}
	t.Logf("dropped during the cut: %+v", s)

	// Heal: held streams are closed, and a join merges the two again.
	sw.Heal()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	// (EOF, or a reset: the node never read the byte written.)
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("read from a held stream after the heal: %v, want it closed", err)
	}
	poll.Until(t, 20*time.Second, "the healed nodes rejoin", func() bool {
		_, _ = b.Join([]string{addr(a)})
		return a.NumMembers() == 2 && b.NumMembers() == 2
	})
}

// Shutting a cut node down does not hang on a dial waiting out its
// timeout, nor on its forwarders.
func TestShutdownWhileCut(t *testing.T) {
	sw := gossipfault.New()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	tr := sw.Wrap(nt)
	sw.Cut()
	done := make(chan error, 1)
	go func() {
		_, err := tr.DialTimeout("127.0.0.1:9", time.Hour)
		done <- err
	}()
	poll.Until(t, 5*time.Second, "the dial is waiting", func() bool { return sw.Dropped().DialsOut == 1 })
	if err := tr.Shutdown(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a cut dial succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cut dial outlived the transport's shutdown")
	}
	if err := tr.Shutdown(); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
}

// A dial still waiting when the cut heals connects then, as a SYN
// retransmitted after the heal would.
func TestDialWaitingOnACutConnectsAfterTheHeal(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sw := gossipfault.New()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	tr := sw.Wrap(nt)
	defer tr.Shutdown()
	sw.Cut()
	done := make(chan error, 1)
	go func() {
		c, err := tr.DialTimeout(ln.Addr().String(), time.Minute)
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	poll.Until(t, 5*time.Second, "the dial is waiting", func() bool { return sw.Dropped().DialsOut == 1 })
	select {
	case err := <-done:
		t.Fatalf("a cut dial returned before the heal: %v", err)
	default:
	}
	sw.Heal()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dial after the heal: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dial did not connect within 10s of the heal")
	}
}
