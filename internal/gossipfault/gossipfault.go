// Package gossipfault injects gossip network faults in-process, without
// root or firewall rules: a Switch wraps memberlist's NetTransport of one
// node (membership.Options.Transport) and, while it is cut, silently drops
// everything that node sends and receives, in both directions.
//
// On loopback every node shares 127.0.0.1 and incoming streams come from
// ephemeral ports, so the fault is node-level: a cut node is cut off from
// everyone. What a cut looks like:
//
//   - outgoing packets are reported sent and never leave (a lost datagram);
//   - incoming packets are discarded before memberlist sees them;
//   - outgoing stream dials hang until their timeout and then fail with a
//     timeout error, as against a firewall that drops SYNs (never refused);
//     one still waiting when the switch heals connects then, as a SYN
//     retransmitted after the heal would;
//   - incoming stream connections are accepted by the kernel but held
//     unread and unanswered until the switch heals or the node shuts down,
//     so the peer's read times out (no EOF, no reset).
//
// Streams established before the cut are left alone; memberlist's streams
// are short-lived (push/pull, fallback pings, reliable sends), bounded by
// its TCPTimeout.
package gossipfault

import (
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Switch cuts and heals the nodes whose transports it wrapped. The zero
// value is not usable; use New. Safe for concurrent use.
type Switch struct {
	cut atomic.Bool

	mu         sync.Mutex
	healed     chan struct{} // closed by Heal; a new one per Cut
	transports map[*Transport]struct{}

	// Counters of what was dropped, for tests and logs.
	packetsOut, packetsIn, dialsOut, streamsIn atomic.Int64
}

// New returns a Switch that is not cut.
func New() *Switch {
	return &Switch{transports: map[*Transport]struct{}{}}
}

// Wrap wraps a node's transport. Its signature is membership.Options'
// Transport hook: pass sw.Wrap.
func (sw *Switch) Wrap(nt *memberlist.NetTransport) memberlist.NodeAwareTransport {
	t := &Transport{
		NetTransport: nt,
		sw:           sw,
		packets:      make(chan *memberlist.Packet),
		streams:      make(chan net.Conn),
		done:         make(chan struct{}),
	}
	sw.mu.Lock()
	sw.transports[t] = struct{}{}
	sw.mu.Unlock()
	t.wg.Add(2)
	go t.forwardPackets()
	go t.forwardStreams()
	return t
}

// Cut starts dropping every packet and stream of the wrapped nodes.
func (sw *Switch) Cut() {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if !sw.cut.Load() {
		sw.healed = make(chan struct{})
		sw.cut.Store(true)
	}
}

// Heal stops dropping, lets the dials waiting on the cut proceed, and
// closes the incoming streams held during the cut (their peers gave up on
// them long ago).
func (sw *Switch) Heal() {
	sw.mu.Lock()
	if sw.cut.Load() {
		sw.cut.Store(false)
		close(sw.healed)
	}
	ts := make([]*Transport, 0, len(sw.transports))
	for t := range sw.transports {
		ts = append(ts, t)
	}
	sw.mu.Unlock()
	for _, t := range ts {
		t.release()
	}
}

// IsCut reports whether the switch is cut.
func (sw *Switch) IsCut() bool { return sw.cut.Load() }

// cutUntil returns a channel closed when the current cut heals, or nil
// when the switch is not cut.
func (sw *Switch) cutUntil() <-chan struct{} {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if !sw.cut.Load() {
		return nil
	}
	return sw.healed
}

// Stats counts what a Switch dropped since New.
type Stats struct {
	PacketsOut, PacketsIn int64 // datagrams not sent, not delivered
	DialsOut, StreamsIn   int64 // stream dials timed out, incoming streams held
}

// Dropped returns the drop counters.
func (sw *Switch) Dropped() Stats {
	return Stats{
		PacketsOut: sw.packetsOut.Load(), PacketsIn: sw.packetsIn.Load(),
		DialsOut: sw.dialsOut.Load(), StreamsIn: sw.streamsIn.Load(),
	}
}

// Transport is one node's NetTransport behind a Switch. It implements
// memberlist.NodeAwareTransport; FinalAdvertiseAddr and GetAutoBindPort
// are the NetTransport's.
type Transport struct {
	*memberlist.NetTransport
	sw *Switch

	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once

	mu   sync.Mutex
	held []net.Conn // incoming streams accepted while cut
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// WriteTo implements memberlist.Transport.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport: while cut the
// packet is lost, and the sender cannot tell.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.sw.IsCut() {
		t.sw.packetsOut.Add(1)
		return time.Now(), nil
	}
	return t.NetTransport.WriteToAddress(b, a)
}

// PacketCh implements memberlist.Transport.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout implements memberlist.Transport.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport: while cut
// the dial waits out its timeout (or the node's shutdown) and fails with a
// timeout error, as when SYNs are dropped; if the cut heals first, it
// dials with the time left.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	healed := t.sw.cutUntil()
	if healed == nil {
		return t.NetTransport.DialAddressTimeout(a, timeout)
	}
	t.sw.dialsOut.Add(1)
	start := time.Now()
	var expired <-chan time.Time
	if timeout > 0 {
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		expired = tm.C
	}
	select {
	case <-healed:
		if left := timeout - time.Since(start); timeout <= 0 || left > 0 {
			return t.DialAddressTimeout(a, max(left, 0))
		}
	case <-expired:
	case <-t.done:
	}
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
}

// StreamCh implements memberlist.Transport.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown implements memberlist.Transport. The NetTransport shuts down
// first, while memberlist still reads the channels the forwarders feed.
func (t *Transport) Shutdown() error {
	var err error
	t.once.Do(func() {
		err = t.NetTransport.Shutdown()
		close(t.done)
		t.wg.Wait()
		t.sw.mu.Lock()
		delete(t.sw.transports, t)
		t.sw.mu.Unlock()
		t.release()
	})
	return err
}

func (t *Transport) forwardPackets() {
	defer t.wg.Done()
	in := t.NetTransport.PacketCh()
	for {
		select {
		case <-t.done:
			return
		case p := <-in:
			if t.sw.IsCut() {
				t.sw.packetsIn.Add(1)
				continue
			}
			select {
			case t.packets <- p:
			case <-t.done:
				return
			}
		}
	}
}

func (t *Transport) forwardStreams() {
	defer t.wg.Done()
	in := t.NetTransport.StreamCh()
	for {
		select {
		case <-t.done:
			return
		case c := <-in:
			if t.sw.IsCut() {
				t.sw.streamsIn.Add(1)
				t.mu.Lock()
				t.held = append(t.held, c)
				t.mu.Unlock()
				continue
			}
			select {
			case t.streams <- c:
			case <-t.done:
				_ = c.Close()
				return
			}
		}
	}
}

// release closes the incoming streams held during a cut.
func (t *Transport) release() {
	t.mu.Lock()
	held := t.held
	t.held = nil
	t.mu.Unlock()
	for _, c := range held {
		_ = c.Close()
	}
}
