package admin

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestHostPolicy(t *testing.T) {
	for _, tc := range []struct {
		listen   string
		allowed  []string
		hostname string
		yes, no  []string
	}{
		{
			listen: "127.0.0.1:9901", hostname: "web-1.prod.example.net",
			yes: []string{
				"", // HTTP/1.0: no Host
				"127.0.0.1", "127.0.0.1:9901", "127.1.2.3:80", "[::1]:9901", "[::1]", "::1",
				"localhost", "localhost:9901", "LOCALHOST:1234", "localhost.", "app.localhost:9901", "a.b.localhost",
				"web-1.prod.example.net", "WEB-1.prod.example.net.:9901", "web-1", "web-1:9901",
				"10.0.0.7:9901", "[fe80::1%25eth0]:9901", "192.168.1.5", // any IP: a rebinding needs a name
			},
			no: []string{
				"evil.example", "evil.example:9901", "localhost.evil.example", "evillocalhost", "web-1.evil.example",
				"prod.example.net", "web-2", "127.0.0.1.nip.io", "2130706433", "[evil.example]:9901",
			},
		},
		{
			listen: ":9901", hostname: "keyway-proxy-7d9f-abcde",
			yes: []string{"10.244.1.17:9901", "[fd00::17]:9901", "keyway-proxy-7d9f-abcde:9901", "localhost:9901"},
			no:  []string{"keyway-proxy.keyway.svc:9901", "keyway-proxy"},
		},
		{
			listen: "admin.internal:9901", hostname: "",
			yes: []string{"admin.internal", "Admin.Internal:9901"},
			no:  []string{"internal", "x.admin.internal"},
		},
		{
			listen: "0.0.0.0:9901", allowed: []string{"keyway-proxy.keyway.svc", "*.ops.example.com", "Admin.Example.org."},
			yes: []string{"keyway-proxy.keyway.svc:9901", "a.ops.example.com", "b.a.ops.example.com:443", "admin.example.org"},
			no:  []string{"ops.example.com", "xops.example.com", "keyway-proxy", "example.org"},
		},
		{
			listen: "127.0.0.1:9901", allowed: []string{"*"},
			yes: []string{"evil.example", "anything:1"},
		},
	} {
		p := newHostPolicy(tc.listen, tc.allowed, tc.hostname)
		for _, h := range tc.yes {
			if !p.allows(h) {
				t.Errorf("listen %s, allowed %v, hostname %q: Host %q refused, want it answered", tc.listen, tc.allowed, tc.hostname, h)
			}
		}
		for _, h := range tc.no {
			if p.allows(h) {
				t.Errorf("listen %s, allowed %v, hostname %q: Host %q answered, want 421", tc.listen, tc.allowed, tc.hostname, h)
			}
		}
	}
}

func TestValidateAllowedHosts(t *testing.T) {
	ok := Config{AllowedHosts: []string{"admin.example.com", "*.example.com", "*", "localhost.", "10.0.0.1", "::1", "my_host"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate(%v): %v", ok.AllowedHosts, err)
	}
	for _, tc := range []struct{ host, want string }{
		{"", `allowed_hosts[0]: "" is empty: write a host name`},
		{"https://admin.example.com", "is a URL, not a host name"},
		{"admin.example.com:9901", "has a port: any port is allowed, write the name alone"},
		{"admin.*.com", "is not a host name"},
		{"*example.com", "is not a host name"},
		{"a..b", "is not a host name"},
		{"a b", "is not a host name"},
	} {
		err := Config{AllowedHosts: []string{tc.host}}.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"*.example.com" for every name under example.com`) {
			t.Errorf("Validate(%q): %v; want an error saying %q and what to write", tc.host, err, tc.want)
		}
	}
}

// A web page that rebinds its own name to 127.0.0.1 sends that name as
// the Host: the listener answers 421, with the Host and the key to add
// it to, on every path; pprof and the configuration included.
func TestDNSRebindingHostRefused(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:9901"}, Options{Gatherer: prometheus.NewRegistry(), Config: &fakeView{}, Sets: testView(), Env: envWith("s3cret")})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/config", "/debug/pprof/", "/debug/pprof/cmdline", "/v1/replica_sets", "/metrics", "/healthz", "/ui", "/nope"} {
		for _, host := range []string{"evil.example", "evil.example:9901"} {
			req := httptest.NewRequest("GET", "http://"+host+path, nil)
			rec := httptest.NewRecorder()
			s.srv.Handler.ServeHTTP(rec, req)
			var body MisdirectedBody
			err := json.Unmarshal(rec.Body.Bytes(), &body)
			if rec.Code != http.StatusMisdirectedRequest || err != nil || body.Host != host || body.Key != "admin.allowed_hosts" ||
				!strings.Contains(body.Error, `add "evil.example" to admin.allowed_hosts`) || rec.Header().Get(AdminHeader) != "1" {
				t.Errorf("GET %s with Host %s: %d %s %s; want 421 naming the Host and admin.allowed_hosts, with %s", path, host, rec.Code, rec.Header(), rec.Body, AdminHeader)
			}
		}
		// The same request with the listener's own address is answered.
		rec := httptest.NewRecorder()
		s.srv.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1:9901"+path, nil))
		if rec.Code == http.StatusMisdirectedRequest || rec.Header().Get(AdminHeader) != "1" {
			t.Errorf("GET %s with Host 127.0.0.1:9901: %d, %s %q", path, rec.Code, AdminHeader, rec.Header().Get(AdminHeader))
		}
	}
	// A reload adds a name.
	s.SetAllowedHosts([]string{"*.example"})
	rec := httptest.NewRecorder()
	s.srv.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "http://evil.example/v1/replica_sets", nil))
	if rec.Code != 200 {
		t.Fatalf("after SetAllowedHosts(*.example): %d %s", rec.Code, rec.Body)
	}
}
