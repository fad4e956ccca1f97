package wire

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"keyway/internal/poll"
)

// heldServer is a Server whose ServeConn hands the woken connection to
// the test and serves it only when told: the moment between the parker's
// wake and fasthttp's counting the connection as served, held open.
type heldServer struct {
	woken   chan *ClientConn
	release chan struct{}
	read    chan string
}

func (s *heldServer) ServeConn(c net.Conn) error {
	s.woken <- c.(*ClientConn)
	<-s.release
	b := make([]byte, 2)
	_, err := io.ReadFull(c, b)
	s.read <- string(b)
	_ = c.Close()
	return err
}

func (s *heldServer) GetOpenConnectionsCount() int32 { return 0 } // none served yet

// acceptPair returns a client connection and the ClientConn f's listener
// accepted for it.
func acceptPair(t *testing.T, f *Front) (client net.Conn, server *ClientConn) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := f.Listen(raw, true)
	t.Cleanup(func() { ln.Close() })
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c := within(t, acc, 5*time.Second, "accept")
	if c == nil {
		t.Fatal("accept failed")
	}
	return client, c.(*ClientConn)
}

// A parked connection the parker woke, not yet served, is still open for
// a draining server (Front.Open), and CloseWaiting leaves it alone: its
// request is read and answered, not reset.
func TestWokenConnectionCountsAsOpenUntilServed(t *testing.T) {
	srv := &heldServer{woken: make(chan *ClientConn, 1), release: make(chan struct{}), read: make(chan string, 1)}
	pk := NewParker(ParkConfig{After: 100 * time.Millisecond, Idle: time.Minute, MaxConns: 100}, srv, nil, zap.NewNop())
	if err := pk.Start(); err != nil {
		t.Fatal(err)
	}
	defer pk.Stop()
	f := &Front{Parker: pk}
	client, c := acceptPair(t, f)
	c.ps.idleUntil = time.Now().Add(time.Minute)
	if !pk.park(c) {
		t.Fatal("park refused")
	}
	if f.Open() != 1 || pk.Stats().Parked.Load() != 1 {
		t.Fatalf("parked: Open %d, Parked %d; want 1 and 1", f.Open(), pk.Stats().Parked.Load())
	}
	if _, err := client.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	woken := within(t, srv.woken, 5*time.Second, "the parker to wake the connection")
	if woken != c {
		t.Fatal("another connection woke")
	}
	if n := pk.Stats().Parked.Load() + int64(srv.GetOpenConnectionsCount()); n != 0 {
		t.Fatalf("parked + served = %d; the moment under test needs 0", n)
	}
	if f.Open() != 1 {
		t.Fatalf("Open() = %d for a woken connection not yet served, want 1", f.Open())
	}
	if n := f.CloseWaiting(); n != 0 {
		t.Fatalf("CloseWaiting closed %d connections, want 0: the woken one has a request", n)
	}
	close(srv.release)
	if got := within(t, srv.read, 5*time.Second, "the request to be read"); got != "hi" {
		t.Fatalf("read %q, want the request", got)
	}
	poll.Until(t, 5*time.Second, "the served connection to close", func() bool { return f.Open() == 0 })
}

// CloseWaiting closes a connection nothing arrived on, and leaves one
// whose request arrived but is not read yet; PendingInput counts it.
func TestCloseWaitingLeavesConnectionsWithUnreadInput(t *testing.T) {
	var f Front
	quietClient, quiet := acceptPair(t, &f)
	spokeClient, spoke := acceptPair(t, &f)
	if _, err := spokeClient.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the request to arrive", spoke.hasInput)
	if f.PendingInput() != 1 {
		t.Fatalf("PendingInput() = %d, want 1", f.PendingInput())
	}
	if n := f.CloseWaiting(); n != 1 {
		t.Fatalf("CloseWaiting closed %d, want 1 (the quiet one)", n)
	}
	_ = quietClient.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := quietClient.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the quiet connection: read %v, want EOF", err)
	}
	b := make([]byte, 2)
	if _, err := io.ReadFull(spoke, b); err != nil || string(b) != "hi" {
		t.Fatalf("the connection with a request: read %q, %v", b, err)
	}
	if f.PendingInput() != 0 {
		t.Fatalf("PendingInput() = %d after the read, want 0", f.PendingInput())
	}
	_ = quiet
}

// A connection no byte has arrived on yet is fresh: its client has just
// dialed. Once a request arrives on it, it is not, even when it waits for
// its next one.
func TestFreshWaitingCountsConnectionsBeforeTheirFirstRequest(t *testing.T) {
	var f Front
	_, quiet := acceptPair(t, &f)
	usedClient, used := acceptPair(t, &f)
	if n := f.FreshWaiting(); n != 2 {
		t.Fatalf("FreshWaiting() = %d with two new connections, want 2", n)
	}
	if _, err := usedClient.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the request to arrive", used.hasInput)
	if n := f.FreshWaiting(); n != 1 {
		t.Fatalf("FreshWaiting() = %d with input waiting on one, want 1", n)
	}
	b := make([]byte, 2)
	if _, err := io.ReadFull(used, b); err != nil {
		t.Fatal(err)
	}
	used.waiting.Store(true) // answered: waiting for its next request
	if n := f.FreshWaiting(); n != 1 {
		t.Fatalf("FreshWaiting() = %d after a request was read, want 1 (the quiet one)", n)
	}
	_ = quiet
}

// Stopping the parker serves a parked connection whose request has
// arrived but that its loop has not woken, rather than closing it; it
// closes the quiet ones. The parker's loop does not run here, so that
// Stop, not the loop, finds the request.
func TestParkerStopServesParkedConnectionsWithInput(t *testing.T) {
	srv := &heldServer{woken: make(chan *ClientConn, 2), release: make(chan struct{}), read: make(chan string, 2)}
	close(srv.release)
	pk := NewParker(ParkConfig{After: 100 * time.Millisecond, Idle: time.Minute, MaxConns: 100}, srv, nil, zap.NewNop())
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	pk.epfd = fd
	pk.deadline = time.Now().Add(time.Hour) // no loop to wake for sweeps
	f := &Front{Parker: pk}
	quietClient, quiet := acceptPair(t, f)
	spokeClient, spoke := acceptPair(t, f)
	for _, c := range []*ClientConn{quiet, spoke} {
		c.ps.idleUntil = time.Now().Add(time.Minute)
		if !pk.park(c) {
			t.Fatal("park refused")
		}
	}
	if _, err := spokeClient.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the request to arrive", spoke.hasInput)
	pk.Stop()
	pk.Wait()
	if got := within(t, srv.read, 5*time.Second, "the request to be read"); got != "hi" {
		t.Fatalf("read %q, want the request", got)
	}
	_ = quietClient.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := quietClient.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the quiet parked connection: read %v, want EOF", err)
	}
	if f.Open() != 0 {
		t.Fatalf("Open() = %d after the stop, want 0", f.Open())
	}
	if pk.Stats().Parked.Load() != 0 {
		t.Fatalf("Parked = %d after the stop, want 0", pk.Stats().Parked.Load())
	}
}
