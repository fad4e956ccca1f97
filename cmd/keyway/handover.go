package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"keyway/membership"
)

// A proxy's listening sockets may come from before this process started:
//
//   - from systemd socket activation (LISTEN_FDS): systemd holds the
//     socket across a stop and start, and clients wait in its queue
//     instead of being refused;
//   - from the old process of a binary upgrade (SIGUSR2, upgrade_unix.go):
//     the new process gets copies of the old one's sockets, accepts on
//     them once it is ready, and the old one then stops accepting and
//     drains.
//
// sockets hands them out to the listeners by address, and opens the
// others itself.
type sockets struct {
	mu        sync.Mutex
	activated []activated // from systemd, not yet handed out
	// upgrades passes the sockets on to an upgrade's new process; nil off
	// Unix, or when upgrades are off.
	upgrades upgrader
	// held names the listeners whose socket systemd holds: it outlives
	// this process, and the next one started gets it.
	held map[string]bool
}

// heldEnv passes held on to an upgrade's new process, which inherits the
// sockets from this one rather than from systemd: space-separated
// listener names.
const heldEnv = "KEYWAY_SYSTEMD_SOCKETS"

// inheritHeld reads heldEnv: an upgrade's new process's only.
func (s *sockets) inheritHeld() {
	for name := range strings.FieldsSeq(os.Getenv(heldEnv)) {
		s.hold(name)
	}
}

// hold records that systemd holds the listener name's socket, and passes
// that on to upgrades (heldEnv), if on. Under mu, or before any use.
func (s *sockets) hold(name string) {
	if s.held == nil {
		s.held = map[string]bool{}
	}
	s.held[name] = true
	names := make([]string, 0, len(s.held))
	for n := range s.held {
		names = append(names, n)
	}
	slices.Sort(names)
	if s.upgrades != nil {
		_ = os.Setenv(heldEnv, strings.Join(names, " "))
	}
}

// SystemdHolds reports whether systemd holds the socket of the listener
// name (socket activation, in this process or before an upgrade): when
// this process stops, the socket lives on, and connections wait in its
// queue for the next process.
func (s *sockets) SystemdHolds(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[name]
}

// upgrader is what sockets needs from tableflip's Fds (upgrade_unix.go).
// Sockets are passed on under the listener's name and address (key):
// "proxy 127.0.0.1:0" and "admin 127.0.0.1:0" are two sockets.
type upgrader interface {
	// Listener returns the inherited listener of this key, or nil.
	Listener(network, key string) (net.Listener, error)
	// Listen opens a listener on addr that an upgrade passes on as key.
	Listen(network, key, addr string) (net.Listener, error)
	// AddListener passes ln on to an upgrade's new process as key.
	AddListener(network, key string, ln net.Listener) error
}

// Listen is the listeners' Listen (server.Options.Listen): the socket
// of the listener name ("proxy", "admin") on addr.
func (s *sockets) Listen(name, network, addr string) (net.Listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := name + " " + addr
	if s.upgrades != nil {
		ln, err := s.upgrades.Listener(network, key)
		if err != nil {
			return nil, err
		}
		if ln != nil {
			return ln, nil
		}
	}
	if ln := s.takeActivated(name, addr); ln != nil {
		s.hold(name)
		if s.upgrades != nil {
			if err := s.upgrades.AddListener(network, key, ln); err != nil {
				return nil, err
			}
		}
		return ln, nil
	}
	if s.upgrades != nil {
		return s.upgrades.Listen(network, key, addr)
	}
	return net.Listen(network, addr)
}

// HasActivated reports whether systemd passed sockets.
func (s *sockets) HasActivated() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.activated) > 0
}

// activated is a socket systemd passed, with its FileDescriptorName.
type activated struct {
	name string
	ln   net.Listener
}

// Unused returns an error naming the sockets systemd passed that no
// listener took: a .socket unit and a configuration that disagree.
func (s *sockets) Unused() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.activated) == 0 {
		return nil
	}
	var addrs []string
	for _, a := range s.activated {
		addrs = append(addrs, a.name+" "+a.ln.Addr().String())
	}
	return usageError{fmt.Sprintf("systemd passed sockets that no listener of keyway uses: %v; name them FileDescriptorName=proxy and FileDescriptorName=admin in the .socket unit, or make its ListenStream= and keyway's listen (and admin.listen) the same addresses", addrs)}
}

// takeActivated returns and forgets the activated socket of the listener
// name: the one systemd names so (FileDescriptorName= in the .socket
// unit), else the one bound to the configured address addr; or nil.
func (s *sockets) takeActivated(name, addr string) net.Listener {
	i := slices.IndexFunc(s.activated, func(a activated) bool { return a.name == name })
	if i < 0 {
		i = slices.IndexFunc(s.activated, func(a activated) bool { return sameAddr(addr, a.ln.Addr()) })
	}
	if i < 0 {
		return nil
	}
	ln := s.activated[i].ln
	s.activated = slices.Delete(s.activated, i, i+1)
	return ln
}

// sameAddr reports whether a socket bound to bound is what the configured
// address addr ("host:port") asks for: the same port, and the same IP, or
// an unspecified one for an empty, "0.0.0.0" or "::" host.
func sameAddr(addr string, bound net.Addr) bool {
	ta, ok := bound.(*net.TCPAddr)
	if !ok {
		return false
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if p, err := strconv.Atoi(port); err != nil || p != ta.Port {
		return false
	}
	if host == "" {
		return ta.IP.IsUnspecified()
	}
	ip := net.ParseIP(host)
	if ip == nil {
		ips, err := net.LookupIP(host)
		if err != nil {
			return false
		}
		return slices.ContainsFunc(ips, ta.IP.Equal)
	}
	return ip.Equal(ta.IP) || (ip.IsUnspecified() && ta.IP.IsUnspecified())
}

// errNoUpgrades is the answer to an upgrade request where upgrades are
// off (off Unix).
var errNoUpgrades = errors.New("binary upgrades need Unix")

// oldGossipAddr is the gossip address of an upgrade's old process: the
// configured one, which this process takes over once the old one has
// left (its advertised address and port when set; a dialable host for an
// all-interfaces bind).
func oldGossipAddr(g membership.Config, port, advertisePort int) string {
	host := g.AdvertiseAddr
	if host == "" {
		host = g.BindAddr
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			host = "127.0.0.1"
		}
	}
	if advertisePort != 0 {
		port = advertisePort
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}
