package admin

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"

	"go.uber.org/zap"
)

// The admin listener answers only requests whose Host names it, so that a
// web page cannot reach it through DNS rebinding: the page's own name
// (evil.example), re-resolved to 127.0.0.1, is sent as the Host, and is
// not one of these. By default it answers to
//
//   - no Host at all (HTTP/1.0);
//   - any IP address: a rebinding needs a name, and an address is what
//     kubelet probes, Prometheus scrapes and a listener on 0.0.0.0 reached
//     at one of the machine's addresses send;
//   - localhost and *.localhost (kubectl port-forward, SSH tunnels);
//   - the machine's host name (os.Hostname), and its first label;
//   - the host of admin.listen when it is a name;
//
// each with any port, and to the names of admin.allowed_hosts ("*.example.com"
// for every name under example.com; "*" for any Host: no check). Anything
// else is 421 Misdirected Request.

// hostPolicy decides which Host headers the admin listener answers. It is
// immutable.
type hostPolicy struct {
	any      bool            // admin.allowed_hosts has "*"
	names    map[string]bool // lower case, no trailing dot
	suffixes []string        // ".example.com" of "*.example.com"
}

// newHostPolicy builds the policy of a listener at listen, with the
// names of admin.allowed_hosts, on a machine called hostname ("" if not
// known).
func newHostPolicy(listen string, allowed []string, hostname string) *hostPolicy {
	p := &hostPolicy{names: map[string]bool{}}
	add := func(name string) {
		name = normalHost(name)
		switch {
		case name == "":
		case name == "*":
			p.any = true
		case strings.HasPrefix(name, "*."):
			p.suffixes = append(p.suffixes, name[1:])
		default:
			p.names[name] = true
		}
	}
	if host, _, err := net.SplitHostPort(listen); err == nil {
		add(host)
	}
	add(hostname)
	if short, _, ok := strings.Cut(hostname, "."); ok {
		add(short)
	}
	for _, n := range allowed {
		add(n)
	}
	return p
}

// allows reports whether the listener answers a request with this Host
// header (host or host:port).
func (p *hostPolicy) allows(hostport string) bool {
	if hostport == "" || p.any {
		return true
	}
	host := normalHost(stripPort(hostport))
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || p.names[host] {
		return true
	}
	for _, s := range p.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

// stripPort returns the host of host:port, [v6]:port, [v6] or host.
func stripPort(hostport string) string {
	if strings.HasPrefix(hostport, "[") {
		if i := strings.IndexByte(hostport, ']'); i > 0 {
			return hostport[1:i]
		}
		return hostport
	}
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 && strings.Count(hostport, ":") == 1 {
		return hostport[:i]
	}
	return hostport
}

// normalHost lower-cases a name and drops its trailing dot.
func normalHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
}

// MisdirectedBody is the answer to a request whose Host the admin
// listener does not answer to (421).
type MisdirectedBody struct {
	Error string `json:"error"`
	// Host is the Host header of the request.
	Host string `json:"host"`
	// Key is the configuration key that would make it answer: admin.allowed_hosts.
	Key string `json:"key"`
}

// guard wraps the listener's handler: every answer carries AdminHeader,
// and a request whose Host the listener does not answer to gets 421.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(AdminHeader, "1")
		if !s.hosts.Load().allows(r.Host) {
			s.log.Debug("admin: Host refused", zap.String("host", r.Host), zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path))
			name := normalHost(stripPort(r.Host))
			s.write(w, http.StatusMisdirectedRequest, MisdirectedBody{
				Error: fmt.Sprintf("this admin listener does not answer to Host %q (a guard against DNS rebinding): "+
					"use its IP address or localhost, or add %q to admin.allowed_hosts if it is a name of this proxy", r.Host, name),
				Host: r.Host,
				Key:  "admin.allowed_hosts",
			})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// SetAllowedHosts replaces the names of admin.allowed_hosts (a reload).
// The names must have passed Config.Validate.
func (s *Server) SetAllowedHosts(names []string) {
	s.hosts.Store(newHostPolicy(s.cfg.Listen, names, s.hostname))
}

// machineName is os.Hostname, or "" when it fails.
func machineName() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}
