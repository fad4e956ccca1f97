package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// A target is one thing the load is sent to: a replica directly, or a
// proxy in front of the replicas.
type target struct {
	name    string
	bin     string // executable; "" for direct
	version string
	// config writes the target's configuration into dir and returns the
	// command line that runs it listening on 127.0.0.1:port.
	config func(dir string, port int, env *targetEnv) ([]string, error)
	// env is extra environment for the process.
	env []string
	// noTLS: the target cannot terminate TLS; -tls skips it.
	noTLS bool
}

// targetEnv is what every proxy configuration is generated from.
type targetEnv struct {
	replicas  []string // host:port of each replica
	maxConns  int      // client connections the proxy must accept (idle test + slack)
	adminPort int      // keyway's admin listener (pprof)
	nofile    uint64   // RLIMIT_NOFILE the proxies inherit
	// tls, when set, makes the proxy terminate TLS 1.3 on its listener
	// with this certificate (tls.go); the replicas stay plain HTTP.
	tls *tlsFiles
	// sat, when set, adds each proxy's overload settings (saturation.go).
	sat *satTargetConfig
	// fwd makes HAProxy and nginx add keyway's forwarding headers
	// (Config.ForwardHeaders).
	fwd bool
	// bodies, when set, makes each proxy stream request bodies up to
	// its maxBody, with timeouts that do not cut them (bodies.go).
	bodies *bodyTargetConfig
	// restart, when set, configures the proxy for the restart mode
	// (restarts.go): its stop, drain and reload settings.
	restart *restartTargetConfig
	// procEnv is set by the config function: extra environment for the
	// proxy's process.
	procEnv []string
}

// targetNames is the order targets are listed in tables.
var targetNames = []string{"direct", "keyway", "gofloor", "haproxy", "nginx", "caddy"}

// newTargets resolves the requested targets: each proxy whose binary is
// found is returned; a missing one gets a note instead.
func newTargets(names []string, keywayBin string) (ts []*target, notes []string, err error) {
	for _, n := range names {
		t := &target{name: n}
		switch n {
		case "direct":
			t.version = "replica 0 of the harness (fasthttp)"
		case "keyway":
			t.bin = keywayBin
			t.config = keywayConfig
			t.env = []string{"GOMAXPROCS=1"}
		case "gofloor":
			self, err := os.Executable()
			if err != nil {
				return nil, nil, fmt.Errorf("gofloor: %w", err)
			}
			t.bin = self
			t.config = floorConfig
			t.noTLS = true
			// As keyway runs: one P, sysmon kept out of deep sleep.
			t.env = []string{"GOMAXPROCS=1", "GODEBUG=schedtrace=2147483647"}
		case "haproxy":
			t.config = haproxyConfig
		case "nginx":
			t.config = nginxConfig
		case "caddy":
			t.config = caddyConfig
			t.env = []string{"GOMAXPROCS=1"}
		default:
			return nil, nil, fmt.Errorf("unknown target %q (known: %s)", n, strings.Join(targetNames, ", "))
		}
		if n != "direct" && n != "keyway" && n != "gofloor" {
			path, err := exec.LookPath(n)
			if err != nil {
				notes = append(notes, fmt.Sprintf("%s skipped: not installed (apt-get install -y %s)", n, n))
				continue
			}
			t.bin = path
		}
		if t.bin != "" {
			t.version = binVersion(n, t.bin)
		}
		ts = append(ts, t)
	}
	return ts, notes, nil
}

func binVersion(name, bin string) string {
	var args []string
	switch name {
	case "keyway", "caddy":
		args = []string{"version"}
	case "gofloor":
		return "minimal fasthttp proxy (bench/floor.go), " + runtime.Version()
	case "haproxy":
		args = []string{"-v"}
	case "nginx":
		args = []string{"-v"}
	}
	out, _ := exec.Command(bin, args...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

func write(dir, name, text string) (string, error) {
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, []byte(text), 0o644)
}

// keywayConfig: static replicas, key header X-Key, one replica set, admin
// on a free loopback port, warn-level logs, no access log. max_conns is
// raised for the idle-connection test; the pool per replica is the default.
// With TLS: the tls section with the run's certificate and TLS 1.3 only;
// Go picks the suite and group (tls.go). With bodies: the set takes
// bodies up to the run's largest, and reading a request and the exchange
// with the replica may take bodyTimeout.
func keywayConfig(dir string, port int, e *targetEnv) ([]string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: \"127.0.0.1:%d\"\n", port)
	var over keywayOverload
	if e.sat != nil {
		over = keywaySaturation(e.sat)
	}
	shutdown, admin, level := "5s", fmt.Sprintf("%q", fmt.Sprintf("127.0.0.1:%d", e.adminPort)), "warn"
	if e.restart != nil {
		// The stop as a user runs it: the drain under test, and info
		// logs for the "proxy listening" line the mode times; no admin
		// listener, whose port a restarted process would have to bind
		// too.
		shutdown, admin, level = e.restart.shutdownTimeout.String(), `""`, "info"
		over.server = append(over.server, "drain_idle: "+e.restart.drainIdle.String())
	}
	fmt.Fprintf(&b, "server:\n  max_conns: %d\n  idle_timeout: 10m\n  shutdown_timeout: %s\n", e.maxConns, shutdown)
	timeouts := "{idle: 10m}"
	if e.bodies != nil {
		// Reading a whole request (server.read_timeout) and the whole
		// exchange with the replica (timeouts.request) include the
		// streamed body.
		over.server = append(over.server, "read_timeout: "+bodyTimeout.String(), "write_timeout: "+bodyTimeout.String())
		over.set = append(over.set, fmt.Sprintf("max_body_bytes: %d", e.bodies.maxBody))
		timeouts = "{idle: 10m, request: " + bodyTimeout.String() + "}"
	}
	for _, l := range over.server {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	for _, l := range over.top {
		fmt.Fprintf(&b, "%s\n", l)
	}
	fmt.Fprintf(&b, "admin:\n  listen: %s\n", admin)
	fmt.Fprintf(&b, "log:\n  level: %s\n  access_log: false\n", level)
	if e.tls != nil {
		fmt.Fprintf(&b, "tls:\n  certificates:\n    - {cert_file: %q, key_file: %q}\n  min_version: \"1.3\"\n  session_tickets: false\n", e.tls.certFile, e.tls.keyFile)
	}
	fmt.Fprintf(&b, "replica_sets:\n  - name: bench\n    replicas: %d\n    key: [{header: X-Key}]\n    timeouts: %s\n", len(e.replicas), timeouts)
	for _, l := range over.set {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	b.WriteString("    static:\n")
	for i, a := range e.replicas {
		fmt.Fprintf(&b, "      - {name: r%d, addr: %q}\n", i, a)
	}
	path, err := write(dir, "keyway.yaml", b.String())
	return []string{"proxy", "-c", path}, err
}

// haproxyConfig: one thread, consistent hashing on the X-Key header,
// keep-alive on both sides with server connections shared between client
// connections (http-reuse always, as keyway's pool is), no logging.
// HAProxy wants 2 × maxconn descriptors and, when it cannot raise
// RLIMIT_NOFILE that far (no CAP_SYS_RESOURCE), refuses to start unless
// strict-limits is off; idle client connections need one descriptor each,
// so the inherited limit is enough for them.
//
// With TLS: the bind line terminates TLS 1.3 only, with Go's suite and
// group; no session cache and no session tickets. HAProxy 2.6 has no
// setting for the number of TLS 1.3 tickets, and OpenSSL sends two
// (stateful, useless without a cache) even with no-tls-tickets, so an
// OpenSSL configuration file (OPENSSL_CONF, applied by OpenSSL to every
// SSL_CTX) sets NumTickets to 0, as nginx does with ssl_conf_command.
//
// With bodies: as it is (HAProxy streams bodies and caps none), but
// timeout server is bodyTimeout.
func haproxyConfig(dir string, port int, e *targetEnv) ([]string, error) {
	bind := ""
	global := ""
	if e.tls != nil {
		bind = fmt.Sprintf(" ssl crt %s ssl-min-ver TLSv1.3 ciphersuites %s curves %s no-tls-tickets", e.tls.pemFile, tlsSuite, tlsGroup)
		global = "  tune.ssl.cachesize 0\n"
		conf, err := write(dir, "openssl.cnf", opensslNoTickets)
		if err != nil {
			return nil, err
		}
		e.procEnv = append(e.procEnv, "OPENSSL_CONF="+conf)
	}
	// With bodies: HAProxy streams them by default (no option
	// http-buffer-request) and caps none; timeout server is the longest
	// the replica may go without reading.
	serverTimeout := "30s"
	if e.bodies != nil {
		serverTimeout = fmt.Sprintf("%ds", int(bodyTimeout.Seconds()))
	}
	args := []string{"-db"}
	if e.restart != nil {
		// Master-worker (-W), reloaded by SIGUSR2 to the master; an old
		// worker stops within shutdownTimeout, as keyway's stop does.
		global += fmt.Sprintf("  hard-stop-after %dms\n", e.restart.shutdownTimeout.Milliseconds())
		args = append(args, "-W")
	}
	defaults := ""
	if e.restart != nil && e.restart.idleClose {
		// An idle keep-alive connection of a stopping worker is kept
		// until its next request, answered with close, as keyway's
		// drain_idle does (or until hard-stop-after).
		defaults = "  option idle-close-on-response\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `global
  nbthread 1
  maxconn %[1]d
  no strict-limits
%[3]s
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 1s
  timeout client 10m
  timeout server %[5]s
  timeout http-keep-alive 10m
  timeout http-request 30s
%[6]s
frontend fe
  bind 127.0.0.1:%[2]d%[4]s
  maxconn %[1]d
  default_backend be

backend be
  balance hdr(X-Key)
  hash-type consistent
`, e.maxConns, port, global, bind, serverTimeout, defaults)
	if e.fwd {
		// keyway's forwarding headers: the client's address appended to
		// any X-Forwarded-For, the scheme and the Host, and a random
		// request ID unless the client sent one.
		b.WriteString(`  option forwardfor
  http-request set-header X-Forwarded-Proto http
  http-request set-header X-Forwarded-Host %[req.hdr(host)]
  http-request set-header X-Request-Id %[uuid] unless { req.hdr(x-request-id) -m found }
`)
	}
	srvOpts := ""
	if e.sat != nil {
		var lines []string
		srvOpts, lines = haproxySaturation(e.sat)
		for _, l := range lines {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	for i, a := range e.replicas {
		fmt.Fprintf(&b, "  server r%d %s%s\n", i, a, srvOpts)
	}
	path, err := write(dir, "haproxy.cfg", b.String())
	return append([]string{"-f", path}, args...), err
}

// opensslNoTickets is an OpenSSL configuration that makes every server
// SSL_CTX send no TLS 1.3 session tickets.
const opensslNoTickets = `openssl_conf = bench_conf
[bench_conf]
ssl_conf = bench_ssl
[bench_ssl]
system_default = bench_system_default
[bench_system_default]
NumTickets = 0
`

// nginxConfig: one worker, consistent (ketama) hashing on $http_x_key,
// upstream keep-alive, no access log, unlimited requests per client
// connection (the default of 1000 would make wrk reconnect).
// worker_connections counts client and upstream connections alike.
//
// With TLS: TLS 1.3 only, with Go's suite (ssl_conf_command, since
// ssl_ciphers does not cover TLS 1.3) and group; no session tickets and no
// session cache and no TLS 1.3 tickets (OpenSSL sends two stateful ones
// otherwise), so that no handshake is a resumption.
//
// With bodies: no cap on a body, neither the request nor the reply
// buffered, and bodyTimeout for every timeout that could cut a body.
func nginxConfig(dir string, port int, e *targetEnv) ([]string, error) {
	tmp := filepath.Join(dir, "nginx-tmp")
	if err := os.MkdirAll(tmp, 0o777); err != nil {
		return nil, err
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;\n"
	}
	listen, tlsConf := "", ""
	if e.tls != nil {
		listen = " ssl"
		tlsConf = fmt.Sprintf(`    ssl_certificate %s;
    ssl_certificate_key %s;
    ssl_protocols TLSv1.3;
    ssl_conf_command Ciphersuites %s;
    ssl_ecdh_curve %s;
    ssl_session_tickets off;
    ssl_session_cache off;
    ssl_conf_command NumTickets 0;
`, e.tls.certFile, e.tls.keyFile, tlsSuite, tlsGroup)
	}
	var ups strings.Builder
	for _, a := range e.replicas {
		fmt.Fprintf(&ups, "    server %s;\n", a)
	}
	maxBody, bodyHTTP, bodyLoc := "8m", "", ""
	if e.bodies != nil {
		// Stream request bodies to the replica as they arrive, and
		// replies to the client (proxy_http_version 1.1 is set below
		// in any case); no cap on a body; no timeout that cuts one.
		secs := int(bodyTimeout.Seconds())
		maxBody = "0"
		bodyHTTP = fmt.Sprintf("  client_body_timeout %[1]ds;\n  send_timeout %[1]ds;\n", secs)
		bodyLoc = fmt.Sprintf("      proxy_request_buffering off;\n      proxy_buffering off;\n      proxy_send_timeout %[1]ds;\n      proxy_read_timeout %[1]ds;\n", secs)
	}
	fwd, fwdMap := "", ""
	if e.fwd {
		// keyway's forwarding headers. proxy_set_header replaces Host
		// with the upstream's name unless set: the client's is kept, as
		// keyway keeps it. $request_id is 32 random hex digits, as
		// keyway's.
		fwd = `      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-Host $http_host;
      proxy_set_header X-Request-Id $bench_request_id;
`
		fwdMap = `  map $http_x_request_id $bench_request_id {
    default $http_x_request_id;
    "" $request_id;
  }
`
	}
	text := fmt.Sprintf(`%[1]sworker_processes 1;
daemon off;
master_process on;
pid %[2]s/nginx.pid;
error_log %[2]s/nginx-error.log warn;
worker_rlimit_nofile %[6]d;
events {
  worker_connections %[3]d;
}
http {
  access_log off;
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  keepalive_timeout 600s;
  keepalive_requests 100000000;
  client_max_body_size %[11]s;
%[12]s  upstream be {
    hash $http_x_key consistent;
%[4]s    keepalive 1024;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
  }
  server {
    listen 127.0.0.1:%[5]d%[7]s;
%[8]s    location / {
      proxy_pass http://be;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
%[9]s%[13]s    }
  }
%[10]s}
`, user, tmp, e.maxConns, ups.String(), port, e.nofile, listen, tlsConf, fwd, fwdMap, maxBody, bodyHTTP, bodyLoc)
	path, err := write(dir, "nginx.conf", text)
	return []string{"-e", filepath.Join(tmp, "nginx-error.log"), "-p", tmp, "-c", path}, err
}

// caddyConfig: JSON config, reverse_proxy with the header selection policy
// on X-Key (rendezvous hashing), keep-alive pool to the replicas, admin
// endpoint off, no access log, error-level logs, HTTP/1.1 only.
//
// With TLS: the run's certificate loaded from files (no automatic HTTPS),
// TLS 1.3 only with X25519, session tickets disabled; Go picks the suite.
func caddyConfig(dir string, port int, e *targetEnv) ([]string, error) {
	var ups []map[string]string
	for _, a := range e.replicas {
		ups = append(ups, map[string]string{"dial": a})
	}
	server := map[string]any{
		"listen":          []string{fmt.Sprintf("127.0.0.1:%d", port)},
		"automatic_https": map[string]any{"disable": true},
		"idle_timeout":    "10m",
		// Like the other proxies: no HTTP/2 (wrk speaks HTTP/1.1), no
		// HTTP/3 listener.
		"protocols": []string{"h1"},
		"routes": []any{map[string]any{"handle": []any{map[string]any{
			"handler":        "reverse_proxy",
			"upstreams":      ups,
			"load_balancing": map[string]any{"selection_policy": map[string]any{"policy": "header", "field": "X-Key"}},
			"transport": map[string]any{
				"protocol":   "http",
				"keep_alive": map[string]any{"enabled": true, "max_idle_conns_per_host": 1024, "idle_timeout": "10m"},
			},
		}}}},
	}
	apps := map[string]any{"http": map[string]any{"servers": map[string]any{"bench": server}}}
	if e.tls != nil {
		server["tls_connection_policies"] = []any{map[string]any{
			"protocol_min": "tls1.3",
			"curves":       []string{strings.ToLower(tlsGroup)},
			"alpn":         []string{"http/1.1"},
		}}
		apps["tls"] = map[string]any{
			"certificates":    map[string]any{"load_files": []any{map[string]any{"certificate": e.tls.certFile, "key": e.tls.keyFile}}},
			"session_tickets": map[string]any{"disabled": true},
		}
	}
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps":    apps,
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	path, err := write(dir, "caddy.json", string(b))
	return []string{"run", "--config", path}, err
}
