package proxy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"

	"keyway/balancer"
)

// The two traffic families' whole exposition after scripted traffic:
// names, HELP, TYPE, labels, the zero-valued series of every status class
// and error kind, the "none" series, and none for a departed replica.
func TestTrafficExposition(t *testing.T) {
	reg := newRegistry()
	r0, r1, dead, gone := startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "dead"), startReplica(t, "gone")
	r1.setHandler(func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(500) })
	p, addr := startProxyOpts(t, Options{Registerer: reg}, func(c *Config) { c.ReplicaSets[0].Match.PathPrefix = "/ingest" }, r0, r1, dead, gone)
	dead.stop(t)
	cl := newClient(addr)
	for i := 0; i < 2; i++ {
		cl.do(t, "POST", "/ingest", "x", "X-Key", keyOwnedBy(t, p, "r0"))
	}
	cl.do(t, "POST", "/ingest", "x", "X-Key", keyOwnedBy(t, p, "r1"))
	cl.do(t, "POST", "/ingest", "x", "X-Key", keyOwnedBy(t, p, "gone"))
	cl.do(t, "POST", "/ingest", "x", "X-Key", keyWithCandidates(t, p, "dead", "r0"))
	cl.do(t, "POST", "/elsewhere", "x")
	p.Router("orders").SetExcluded("r0", balancer.ReasonProbe, true)
	p.Router("orders").SetExcluded("r1", balancer.ReasonProbe, true)
	p.Router("orders").SetExcluded("gone", balancer.ReasonProbe, true)
	cl.do(t, "POST", "/ingest", "x", "X-Key", "k") // 503: nothing in rotation
	p.Router("orders").SetReplicas("static", []balancer.Replica{
		{Name: "r0", Addr: r0.addr(), State: balancer.StateReady},
		{Name: "r1", Addr: r1.addr(), State: balancer.StateReady},
		{Name: "dead", Addr: dead.addr(), State: balancer.StateReady},
	})

	nonZero := map[string]int{
		"orders/r0/2xx": 3, "orders/r1/5xx": 1, "orders/none/5xx": 1, "none/none/4xx": 1, "orders/dead/dial": 1,
	}
	var want strings.Builder
	want.WriteString("# HELP keyway_requests_total Requests answered, by replica set, replica (\"none\" when keyway answered itself) and status class (1xx..5xx).\n# TYPE keyway_requests_total counter\n")
	for _, sr := range [][2]string{{"none", "none"}, {"orders", "dead"}, {"orders", "none"}, {"orders", "r0"}, {"orders", "r1"}} {
		for _, c := range []string{"1xx", "2xx", "3xx", "4xx", "5xx"} {
			fmt.Fprintf(&want, "keyway_requests_total{code=%q,replica=%q,set=%q} %d\n", c, sr[1], sr[0], nonZero[sr[0]+"/"+sr[1]+"/"+c])
		}
	}
	want.WriteString("# HELP keyway_upstream_errors_total Failed exchanges with a replica, by kind: dial, stale_conn, no_free_conns, timeout, reset, other, reused_closed, tls_handshake, reply_too_large.\n# TYPE keyway_upstream_errors_total counter\n")
	kinds := []string{"dial", "stale_conn", "no_free_conns", "timeout", "reset", "other", "reused_closed", "tls_handshake", "reply_too_large"}
	slices.Sort(kinds)
	for _, r := range []string{"dead", "r0", "r1"} {
		for _, k := range kinds {
			fmt.Fprintf(&want, "keyway_upstream_errors_total{kind=%q,replica=%q,set=%q} %d\n", k, r, "orders", nonZero["orders/"+r+"/"+k])
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String()), "keyway_requests_total", "keyway_upstream_errors_total"); err != nil {
		t.Fatal(err)
	}
	// Like a CounterVec's children, every series says when it was created
	// (protobuf exposition).
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if n := mf.GetName(); n != "keyway_requests_total" && n != "keyway_upstream_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetCounter().GetCreatedTimestamp() == nil {
				t.Errorf("%s %v has no created timestamp", mf.GetName(), m.GetLabel())
			}
		}
	}
}
