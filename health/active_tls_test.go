package health

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// A set whose replicas speak TLS is probed over TLS, with the
// configuration ProbeTLS gives per replica (the proxy's: its CA, client
// certificate and server name); one that ProbeTLS leaves at nil is probed
// over plain HTTP.
func TestActiveProbeOverTLS(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string]bool{} // "tls" or "plain"
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[map[bool]string{true: "tls", false: "plain"}[r.TLS != nil]] = true
		mu.Unlock()
	})
	secure := httptest.NewTLSServer(handler)
	defer secure.Close()
	plain := httptest.NewServer(handler)
	defer plain.Close()
	roots := secure.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs

	var calls sync.Map
	lc := startChecker(t, activeConfig(), func(set, replica, addr string) *tls.Config {
		calls.Store(set+"/"+replica+"@"+addr, true)
		switch replica {
		case "secure":
			return &tls.Config{RootCAs: roots, ServerName: "example.com"}
		case "untrusted":
			return &tls.Config{ServerName: "example.com"} // the system's roots do not know httptest's CA
		}
		return nil
	})
	secureAddr, plainAddr := secure.Listener.Addr().String(), plain.Listener.Addr().String()
	lc.c.SetTargets("s", []Target{{Replica: "secure", Addr: secureAddr}, {Replica: "plain", Addr: plainAddr}, {Replica: "untrusted", Addr: secureAddr}})
	lc.waitCount(t, "s", "secure", "pass", 2)
	lc.waitCount(t, "s", "plain", "pass", 2)
	lc.waitCount(t, "s", "untrusted", "error", 3)
	for e := lc.next(t); ; e = lc.next(t) {
		if e.Replica == "untrusted" && e.Kind == EventProbeDown {
			break
		}
		if e.Kind == EventProbeDown {
			t.Fatalf("event %+v: only the untrusted replica fails its probes", e)
		}
	}
	for _, c := range lc.sink.take() {
		if c.Excluded && c.Replica != "untrusted" {
			t.Fatalf("sink call %+v", c)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !seen["tls"] || !seen["plain"] {
		t.Fatalf("probes seen: %v, want both over TLS and plain HTTP", seen)
	}
	if _, ok := calls.Load("s/secure@" + secureAddr); !ok {
		t.Fatal("ProbeTLS was not asked with the set, replica and address")
	}
}
