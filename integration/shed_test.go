package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/admin"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
)

// Load shedding seen from outside (docs/proxy.md, Overload): the real
// binary in front of replicas in the test process that can be made to
// hang or to say they are saturated, and that count every request they
// receive, so that "not delivered" and "the key did not move" are checked
// where the requests would arrive.

// shedReplica stands in for a pipeline replica: a fasthttp server on
// 127.0.0.1:0 that answers like the demo replica (JSON naming itself and
// the key) and counts the requests it receives by X-Key ("" for keyless
// ones). hold makes it keep requests until released; saturateNext makes
// its next answer say it is saturated.
type shedReplica struct {
	name, addr string
	arrived    chan string // the keys of held requests, as they arrive

	mu   sync.Mutex
	keys map[string]int
	gate chan struct{} // non-nil: requests wait until it is closed
	// start, with slow: the answers' headers wait until it is closed
	// (startAnswers), so that every request is admitted before the heap
	// grows with the answers.
	start chan struct{}
	// slow > 0: while holding, answer at once with a body of slow bytes
	// of which only the first 64KiB are sent before the release.
	slow int
	// The next answer carries X-Keyway-Pressure: saturated with this
	// Retry-After and status ("": an ordinary answer).
	retryAfter string
	status     int
}

func startShedReplica(t *testing.T, name string) *shedReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &shedReplica{name: name, addr: ln.Addr().String(), keys: map[string]int{}, arrived: make(chan string, 64)}
	srv := &fasthttp.Server{
		// Large bodies held at once (the memory guard tests).
		MaxRequestBodySize: 16 << 20,
		Handler: func(ctx *fasthttp.RequestCtx) {
			key := string(ctx.Request.Header.Peek("X-Key"))
			r.mu.Lock()
			r.keys[key]++
			gate, slow, start := r.gate, r.slow, r.start
			ra, status := r.retryAfter, r.status
			r.retryAfter = ""
			r.mu.Unlock()
			if gate != nil && slow > 0 {
				r.arrived <- key
				<-start
				ctx.SetBodyStream(&gatedReader{left: slow, before: 64 << 10, gate: gate}, slow)
				return
			}
			if gate != nil {
				r.arrived <- key
				<-gate
			}
			if ra != "" {
				ctx.SetStatusCode(status)
				ctx.Response.Header.Set("X-Keyway-Pressure", "saturated")
				ctx.Response.Header.Set("Retry-After", ra)
			}
			ctx.SetContentType("application/json")
			b, _ := json.Marshal(Answer{Replica: r.name, Key: key})
			ctx.SetBody(b)
		},
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	// The proxy started after this replica is killed before these run
	// (cleanups run last-registered first), so no connection stays busy.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.ShutdownWithContext(ctx); err != nil {
			t.Errorf("replica %s: %v", name, err)
		}
		<-done
	})
	t.Cleanup(func() { r.release() }) // before the shutdown above
	return r
}

// hold makes the replica keep the requests it receives until release.
func (r *shedReplica) hold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gate == nil {
		r.gate = make(chan struct{})
	}
}

// holdSlowly makes the replica answer with a body of size bytes, sending
// the headers and the first 64KiB on startAnswers and the rest on release.
func (r *shedReplica) holdSlowly(size int) {
	r.mu.Lock()
	r.slow = size
	r.start = make(chan struct{})
	r.mu.Unlock()
	r.hold()
}

// startAnswers lets the answers held by holdSlowly begin.
func (r *shedReplica) startAnswers() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.start != nil {
		close(r.start)
		r.start = nil
	}
}

// gatedReader yields left bytes, waiting for its gate once before of them
// have been read.
type gatedReader struct {
	left, before int
	gate         chan struct{}
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.left == 0 {
		return 0, io.EOF
	}
	if g.before == 0 {
		<-g.gate
		g.before = -1
	}
	n := min(len(p), g.left)
	if g.before > 0 {
		n = min(n, g.before)
		g.before -= n
	}
	for i := range n {
		p[i] = 'x'
	}
	g.left -= n
	return n, nil
}

// release answers the held requests and stops holding new ones.
func (r *shedReplica) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.start != nil {
		close(r.start)
		r.start = nil
	}
	if r.gate != nil {
		close(r.gate)
		r.gate, r.slow = nil, 0
	}
}

// saturateNext makes the next answer carry X-Keyway-Pressure: saturated
// and Retry-After: retryAfter, with status.
func (r *shedReplica) saturateNext(status int, retryAfter string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status, r.retryAfter = status, retryAfter
}

// count returns how many requests with each of keys the replica received.
func (r *shedReplica) count(keys ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, k := range keys {
		n += r.keys[k]
	}
	return n
}

// waitArrivals waits until n held requests have arrived at the replica.
func (r *shedReplica) waitArrivals(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for i := range n {
		select {
		case <-r.arrived:
		case <-timeout:
			t.Fatalf("%s: %d of %d held requests arrived within 10s", r.name, i, n)
		}
	}
}

// shedReply is what the proxy answered.
type shedReply struct {
	status     int
	retryAfter string
	pressure   string        // X-Keyway-Pressure
	replica    string        // the replica that answered 200
	size       int           // of the body
	reason     string        // the shed reason in keyway's JSON error body
	errBody    errorJSON     // keyway's JSON error body, when it answered itself
	took       time.Duration // from sending to the whole answer
	err        error
}

type errorJSON struct {
	Error      string `json:"error"`
	ReplicaSet string `json:"replica_set"`
	Replica    string `json:"replica"`
	Reason     string `json:"reason"`
}

// shedClient sends requests to a proxy; every concurrent request gets its
// own connection.
type shedClient struct {
	proxy string
	hc    *http.Client
}

func newShedClient(t *testing.T, proxy string) *shedClient {
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	t.Cleanup(tr.CloseIdleConnections)
	return &shedClient{proxy: proxy, hc: &http.Client{Timeout: 15 * time.Second, Transport: tr}}
}

// send POSTs body with X-Key: key (none when key is "").
func (c *shedClient) send(key, body string) shedReply {
	req, _ := http.NewRequest("POST", "http://"+c.proxy+"/ingest", strings.NewReader(body))
	if key != "" {
		req.Header.Set("X-Key", key)
	}
	start := time.Now()
	resp, err := c.hc.Do(req)
	if err != nil {
		return shedReply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	r := shedReply{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"),
		pressure: resp.Header.Get("X-Keyway-Pressure"), size: len(b), took: time.Since(start), err: err}
	// keyway's own answers carry "error"; a replica's name itself.
	var a Answer
	if json.Unmarshal(b, &r.errBody) == nil && r.errBody.Error != "" {
		r.reason = r.errBody.Reason
	} else if json.Unmarshal(b, &a) == nil {
		r.replica = a.Replica
	}
	return r
}

// sendAsync sends in a goroutine; the answer arrives on the channel.
func (c *shedClient) sendAsync(key, body string) <-chan shedReply {
	ch := make(chan shedReply, 1)
	go func() { ch <- c.send(key, body) }()
	return ch
}

func (r shedReply) String() string {
	if r.err != nil {
		return r.err.Error()
	}
	return fmt.Sprintf("%d (replica %q, reason %q, Retry-After %q, %+v)", r.status, r.replica, r.reason, r.retryAfter, r.errBody)
}

// wantServed fails the test unless r is a 200 from replica.
func wantServed(t *testing.T, what string, r shedReply, replica string) {
	t.Helper()
	if r.err != nil || r.status != 200 || r.replica != replica {
		t.Fatalf("%s: got %s, want 200 from %s", what, r, replica)
	}
}

// wantShed fails the test unless r is keyway's shed answer: status,
// Retry-After: retryAfter, reason, naming the set and replica ("" for a
// set-wide or memory shed), at once (well within the request timeout).
func wantShed(t *testing.T, what string, r shedReply, status int, retryAfter, reason, replica string) {
	t.Helper()
	if r.err != nil || r.status != status || r.retryAfter != retryAfter || r.reason != reason ||
		r.errBody.ReplicaSet != "orders" || r.errBody.Replica != replica || !strings.Contains(r.errBody.Error, "not delivered") {
		t.Fatalf("%s: got %s, want %d, Retry-After %s, reason %q, replica %q, \"not delivered\"", what, r, status, retryAfter, reason, replica)
	}
	if r.took > 2*time.Second {
		t.Fatalf("%s: the shed answer took %s: it should come at once", what, r.took)
	}
}

// shedStack starts the real binary serving the set orders over the given
// replicas (static), with extra YAML for the server section and for the
// set, and returns the proxy and admin addresses once every replica is in
// rotation.
func shedStack(t *testing.T, server, set string, reps ...*shedReplica) (proxyAddr, adminAddr string, p *Proc) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, `listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
server: {%s}
replica_sets:
  - name: orders
    replicas: %d
    timeouts: {request: 10s}
    static:
`, server, len(reps))
	for _, r := range reps {
		fmt.Fprintf(&b, "      - {name: %s, addr: %q}\n", r.name, r.addr)
	}
	b.WriteString(set)
	cfg := WriteFile(t, t.TempDir(), "shed.yaml", b.String())
	p = Start(t, "keyway", "proxy", "-c", cfg)
	proxyAddr = p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	adminAddr = p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]
	stacktest.WaitRotation(t, adminAddr, "orders", len(reps))
	return proxyAddr, adminAddr, p
}

// keysOf returns n keys whose requests go to each replica now, as the
// admin API's route explanation says.
func keysOf(t *testing.T, adminAddr string, n int, replicas ...string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for i := 0; ; i++ {
		done := true
		for _, r := range replicas {
			done = done && len(out[r]) >= n
		}
		if done {
			return out
		}
		if i == 1000 {
			t.Fatalf("1000 keys do not give %d to each of %v: %v", n, replicas, out)
		}
		key := fmt.Sprintf("shed-%04d", i)
		var ex admin.RouteExplain
		stacktest.GetJSON(t, "http://"+adminAddr+"/v1/route?set=orders&key="+url.QueryEscape(key), &ex)
		if len(out[ex.Pick]) < n {
			out[ex.Pick] = append(out[ex.Pick], key)
		}
	}
}

// localResponses is keyway_local_responses_total{set="orders",reason}.
func localResponses(adminAddr, reason string) float64 {
	return Metric(adminAddr, "keyway_local_responses_total", map[string]string{"set": "orders", "reason": reason})
}

// setStatus is the admin API's view of the set orders.
func setStatus(t *testing.T, adminAddr string) admin.SetStatus {
	t.Helper()
	var st admin.SetStatus
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/replica_sets/orders", &st)
	if st.Traffic == nil {
		t.Fatalf("set orders without traffic: %+v", st)
	}
	return st
}

func replicaStatus(t *testing.T, st admin.SetStatus, name string) admin.ReplicaStatus {
	t.Helper()
	for _, r := range st.Replicas {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("replica %s not in %+v", name, st.Replicas)
	return admin.ReplicaStatus{}
}

// A replica that stops answering is bounded by
// limits.max_inflight_per_replica: once its slots are full, further
// requests for its keys are shed at once (503, or 429 with
// overload_status: 429) without reaching any replica, keyless requests
// and other replicas' keys are served, and once the held requests are
// answered its keys are served again. The shed answers are counted in
// keyway_local_responses_total, the admin API and keyway status.
func TestShedHungReplica(t *testing.T) {
	skipShort(t)
	for _, status := range []int{503, 429} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			checkHungReplica(t, status)
		})
	}
}

func checkHungReplica(t *testing.T, status int) {
	const slots = 2
	a, b := startShedReplica(t, "orders-0"), startShedReplica(t, "orders-1")
	px, adm, _ := shedStack(t, "", fmt.Sprintf("    limits: {max_inflight_per_replica: %d, overload_status: %d}\n", slots, status), a, b)
	keys := keysOf(t, adm, 6, a.name, b.name)
	ka, kb := keys[a.name], keys[b.name]
	c := newShedClient(t, px)
	// A reading of the counters before any shedding: the shed rate of
	// keyway status compares a later reading with it.
	if st := setStatus(t, adm); st.Traffic.ShedTotal != 0 {
		t.Fatalf("shed_total %d before any load", st.Traffic.ShedTotal)
	}

	a.hold()
	var held []<-chan shedReply
	for _, k := range ka[:slots] {
		held = append(held, c.sendAsync(k, "payload"))
	}
	a.waitArrivals(t, slots)

	// orders-0's slots are full: its keys are shed, not moved.
	shedKeys := ka[slots:]
	for _, k := range shedKeys {
		wantShed(t, "a key of the full replica", c.send(k, "payload"), status, "1", "overloaded", a.name)
	}
	// orders-1 serves its own keys, and the keyless requests round robin
	// would have given orders-0.
	for _, k := range kb {
		wantServed(t, "a key of the other replica", c.send(k, "payload"), b.name)
	}
	for range 4 {
		wantServed(t, "a keyless request", c.send("", "payload"), b.name)
	}
	if n := a.count(shedKeys...) + b.count(shedKeys...); n != 0 {
		t.Fatalf("%d shed requests reached a replica", n)
	}
	if n := a.count(ka[:slots]...); n != slots {
		t.Fatalf("orders-0 received %d of the held requests, want %d", n, slots)
	}
	if st := replicaStatus(t, setStatus(t, adm), a.name); !st.InRotation || st.Inflight != slots {
		t.Fatalf("orders-0 while full: in rotation %v, in flight %d; want in rotation, %d in flight", st.InRotation, st.Inflight, slots)
	}

	// Counted: the metric, the admin API and keyway status.
	n := len(shedKeys)
	if got := localResponses(adm, "overloaded"); got != float64(n) {
		t.Fatalf("keyway_local_responses_total{reason=overloaded} = %v, want %d", got, n)
	}
	if st := setStatus(t, adm); st.Traffic.ShedTotal != uint64(n) {
		t.Fatalf("shed_total %d, want %d", st.Traffic.ShedTotal, n)
	}
	want := fmt.Sprintf("%d in all", n)
	var out string
	poll.Until(t, 5*time.Second, "keyway status showing the shedding", func() bool {
		b, err := exec.Command(Binary, "status", "--admin", adm).CombinedOutput()
		out = string(b)
		if err != nil {
			t.Fatalf("keyway status: %v\n%s", err, b)
		}
		return strings.Contains(out, "SHEDDING:") && strings.Contains(out, want)
	})
	t.Logf("keyway status:\n%s", out)

	// Released, orders-0 answers its held requests and takes its keys
	// again.
	a.release()
	for _, h := range held {
		wantServed(t, "a held request", <-h, a.name)
	}
	for _, k := range shedKeys {
		wantServed(t, "a key of the released replica", c.send(k, "payload"), a.name)
	}
	if got := localResponses(adm, "overloaded"); got != float64(n) {
		t.Fatalf("keyway_local_responses_total{reason=overloaded} = %v after the release, want %d", got, n)
	}
}

// A replica that says it is saturated (X-Keyway-Pressure: saturated with
// Retry-After) has its keyed requests shed with 503 replica_saturated for
// that long, capped by limits.max_pressure_hold; none of them reaches a
// replica meanwhile, its answer is relayed as is, it is not ejected (even
// by a 503 under the strictest passive health checks), and afterwards its
// keys go to it again.
func TestShedSaturatedReplica(t *testing.T) {
	skipShort(t)
	a, b := startShedReplica(t, "orders-0"), startShedReplica(t, "orders-1")
	const maxHold = 1500 * time.Millisecond
	px, adm, _ := shedStack(t, "", `    limits: {max_pressure_hold: 1500ms}
health:
  passive: {enabled: true, consecutive_failures: 1, count: [5xx], base_ejection: 10m, max_ejection: 10m, max_ejected_share: 1, interval: 20ms}
`, a, b)
	keys := keysOf(t, adm, 3, a.name, b.name)
	ka, kb := keys[a.name], keys[b.name]
	c := newShedClient(t, px)
	shedTotal := 0

	for _, tc := range []struct {
		status     int
		retryAfter string
		hold       time.Duration
		firstWait  string // Retry-After of the first shed answer: the hold left, rounded up
	}{
		{503, "1", time.Second, "1"},
		// The replica asks for a minute; keyway holds max_pressure_hold.
		{200, "60", maxHold, "2"},
	} {
		a.saturateNext(tc.status, tc.retryAfter)
		start := time.Now()
		r := c.send(ka[0], "payload")
		end := time.Now()
		if r.err != nil || r.status != tc.status || r.replica != a.name || r.pressure != "saturated" || r.retryAfter != tc.retryAfter {
			t.Fatalf("the saturated answer: got %s, pressure %q; want it relayed: %d from %s, saturated, Retry-After %s",
				r, r.pressure, tc.status, a.name, tc.retryAfter)
		}
		beforeA, beforeB := a.count(ka...), b.count(ka...)
		first := true
		var served shedReply
		var servedAt time.Time
		shed := 0
		poll.Until(t, tc.hold+5*time.Second, "orders-0 taking its keys again", func() bool {
			sent := time.Now()
			served = c.send(ka[1], "payload")
			servedAt = time.Now()
			if served.status == 200 {
				return true
			}
			// Retry-After is the hold left, rounded up: the first shed
			// answer, right after the saturated one, says the whole hold.
			wait := served.retryAfter
			if wait != "1" && wait != tc.firstWait || first && sent.Sub(end) < 100*time.Millisecond {
				wait = tc.firstWait
			}
			wantShed(t, "a key of the saturated replica", served, 503, wait, "replica_saturated", a.name)
			shed++
			if first {
				first = false
				// Meanwhile other replicas' keys are served, and orders-0
				// stays in rotation.
				wantServed(t, "a key of the other replica", c.send(kb[0], "payload"), b.name)
				if st := replicaStatus(t, setStatus(t, adm), a.name); !st.InRotation {
					t.Fatalf("orders-0 out of rotation while saturated: %+v", st)
				}
				if n := a.count(ka...) - beforeA + b.count(ka...) - beforeB; n != 0 {
					t.Fatalf("%d requests for orders-0's keys reached a replica during the hold", n)
				}
			}
			return false
		})
		wantServed(t, "a key of orders-0 after the hold", served, a.name)
		// Exactly one request for orders-0's keys reached a replica since
		// the saturated answer: the one just served, by orders-0.
		if na, nb := a.count(ka...)-beforeA, b.count(ka...)-beforeB; na != 1 || nb != 0 {
			t.Fatalf("orders-0 received %d and orders-1 %d requests for orders-0's keys during and after the hold, want 1 and 0 (the answered one)", na, nb)
		}
		t.Logf("Retry-After %s: %d requests shed over %s (from the saturated answer's request to the first served; hold %s)",
			tc.retryAfter, shed, servedAt.Sub(start).Round(time.Millisecond), tc.hold)
		if shed == 0 {
			t.Fatalf("no request shed after the saturated answer")
		}
		// The hold began once keyway had the saturated answer: a served
		// answer within it, or a hold much longer than asked, is wrong.
		if got := servedAt.Sub(start); got < tc.hold || servedAt.Sub(end) > tc.hold+time.Second {
			t.Fatalf("first served %s after the saturated request was sent (%s after its answer), want a hold of %s", got, servedAt.Sub(end), tc.hold)
		}
		shedTotal += shed
	}

	if got := localResponses(adm, "replica_saturated"); got != float64(shedTotal) {
		t.Fatalf("keyway_local_responses_total{reason=replica_saturated} = %v, want %d", got, shedTotal)
	}
	st := setStatus(t, adm)
	if st.Traffic.ShedTotal != uint64(shedTotal) {
		t.Fatalf("shed_total %d, want %d", st.Traffic.ShedTotal, shedTotal)
	}
	if r := replicaStatus(t, st, a.name); !r.InRotation || r.Traffic == nil || r.Traffic.EjectionsTotal != 0 {
		t.Fatalf("orders-0 after its saturated answers: %+v, want in rotation and never ejected", r)
	}
}

// limits.max_inflight bounds the set's requests in flight on the proxy:
// beyond it every request, keyed or not, is shed with 503 set_overloaded
// and reaches no replica.
func TestShedSetMaxInflight(t *testing.T) {
	skipShort(t)
	a, b := startShedReplica(t, "orders-0"), startShedReplica(t, "orders-1")
	px, adm, _ := shedStack(t, "", "    limits: {max_inflight: 2}\n", a, b)
	keys := keysOf(t, adm, 3, a.name, b.name)
	ka, kb := keys[a.name], keys[b.name]
	c := newShedClient(t, px)

	a.hold()
	b.hold()
	held := []<-chan shedReply{c.sendAsync(ka[0], "payload"), c.sendAsync(kb[0], "payload")}
	a.waitArrivals(t, 1)
	b.waitArrivals(t, 1)
	for _, k := range []string{ka[1], kb[1], ""} {
		wantShed(t, fmt.Sprintf("key %q beyond max_inflight", k), c.send(k, "payload"), 503, "1", "set_overloaded", "")
	}
	if n := a.count(ka[1], kb[1], "") + b.count(ka[1], kb[1], ""); n != 0 {
		t.Fatalf("%d shed requests reached a replica", n)
	}
	if got := localResponses(adm, "set_overloaded"); got != 3 {
		t.Fatalf("keyway_local_responses_total{reason=set_overloaded} = %v, want 3", got)
	}
	a.release()
	b.release()
	wantServed(t, "a held request", <-held[0], a.name)
	wantServed(t, "a held request", <-held[1], b.name)
	wantServed(t, "a key of orders-0 after the release", c.send(ka[1], "payload"), a.name)
	wantServed(t, "a key of orders-1 after the release", c.send(kb[1], "payload"), b.name)
	if st := setStatus(t, adm); st.Traffic.ShedTotal != 3 {
		t.Fatalf("shed_total %d, want 3", st.Traffic.ShedTotal)
	}
}

// The memory guard: request bodies held by requests in flight are bounded
// by server.max_inflight_body_bytes, and the live heap by
// server.max_heap_bytes; beyond either, requests are shed with 503
// memory.
func TestShedMemoryGuard(t *testing.T) {
	skipShort(t)
	t.Run("inflight_bodies", func(t *testing.T) {
		t.Parallel()
		a, b := startShedReplica(t, "orders-0"), startShedReplica(t, "orders-1")
		px, adm, _ := shedStack(t, "max_inflight_body_bytes: 1MiB, body_buffer_bytes: 1MiB", "", a, b)
		keys := keysOf(t, adm, 2, a.name, b.name)
		ka, kb := keys[a.name], keys[b.name]
		c := newShedClient(t, px)
		big := strings.Repeat("x", 700<<10)

		a.hold()
		held := c.sendAsync(ka[0], big)
		a.waitArrivals(t, 1)
		// 700KiB held at orders-0: another 700KiB would exceed 1MiB, even
		// for a replica that is free.
		wantShed(t, "a second large body", c.send(kb[0], big), 503, "1", "memory", "")
		if n := b.count(kb[0]); n != 0 {
			t.Fatalf("the shed body reached orders-1 (%d)", n)
		}
		wantServed(t, "a small body meanwhile", c.send(kb[0], "small"), b.name)
		if got := Metric(adm, "keyway_memory_guard_shedding", nil); got != 0 {
			t.Fatalf("keyway_memory_guard_shedding = %v, want 0: it is about the heap bound", got)
		}
		a.release()
		wantServed(t, "the held body", <-held, a.name)
		wantServed(t, "a large body after the release", c.send(kb[0], big), b.name)
		if got := localResponses(adm, "memory"); got != 1 {
			t.Fatalf("keyway_local_responses_total{reason=memory} = %v, want 1", got)
		}
	})
	// The heap bound, in the configuration docs/proxy.md recommends with
	// it (reduce_memory: the connections that read large bodies keep no
	// buffer once idle) and in the default one, where they do until they
	// close: there the client closes each connection after its answer.
	for _, tc := range []struct {
		name, server string
		keepAlive    bool
	}{
		{"heap", "max_heap_bytes: 16MiB, reduce_memory: true, body_buffer_bytes: 1MiB", true},
		{"heap_default", "max_heap_bytes: 16MiB, body_buffer_bytes: 1MiB", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkHeapGuard(t, tc.server, tc.keepAlive)
		})
	}
}

func checkHeapGuard(t *testing.T, server string, keepAlive bool) {
	a, b := startShedReplica(t, "orders-0"), startShedReplica(t, "orders-1")
	px, adm, p := shedStack(t, server, "", a, b)
	keys := keysOf(t, adm, 2, a.name, b.name)
	ka, kb := keys[a.name], keys[b.name]
	c := newShedClient(t, px)
	c.hc.Transport.(*http.Transport).DisableKeepAlives = !keepAlive
	shedding := func() float64 { return Metric(adm, "keyway_memory_guard_shedding", nil) }
	if got := shedding(); got != 0 {
		t.Fatalf("keyway_memory_guard_shedding = %v at rest, want 0", got)
	}
	wantServed(t, "a request at rest", c.send(kb[0], "small"), b.name)

	// Answers of 1MiB that orders-0 sends slowly: keyway reads an answer
	// that fits server.body_buffer_bytes (1MiB here) whole, in a buffer
	// of its Content-Length made once the headers are in (a longer one
	// it streams, holding none of it), so with 24 under way the live heap
	// is above 16MiB whatever the collector does. All were admitted
	// before.
	const size, n = 1 << 20, 24
	a.holdSlowly(size)
	var held []<-chan shedReply
	for i := range n {
		held = append(held, c.sendAsync(ka[i%2], "small"))
	}
	a.waitArrivals(t, n)
	a.startAnswers()
	poll.Until(t, 5*time.Second, "keyway_memory_guard_shedding 1 with 24MiB of answers in flight", func() bool { return shedding() == 1 })
	wantShed(t, "a request above max_heap_bytes", c.send(kb[0], "small"), 503, "1", "memory", "")
	if n := b.count(kb[0]); n != 1 {
		t.Fatalf("orders-1 received %d requests for its key, want 1 (the one at rest): a shed request reached it", n)
	}
	p.WaitLine(t, regexp.MustCompile(`"msg":"memory guard: the heap is above server.max_heap_bytes; shedding new requests with 503"`), 5*time.Second)

	a.release()
	for _, h := range held {
		if r := <-h; r.err != nil || r.status != 200 || r.size != size {
			t.Fatalf("a slow answer: got %s with %d bytes, want 200 with %d", r, r.size, size)
		}
	}
	// Waiting on the log, not on /metrics: every scrape allocates, and
	// scrapes every 20ms would start the collections the guard must start
	// itself when keyway is otherwise idle.
	start := time.Now()
	p.WaitLine(t, regexp.MustCompile(`"msg":"memory guard: the heap is below server.max_heap_bytes again; admitting requests"`), 5*time.Second)
	t.Logf("the guard let go %s after the answers were relayed", time.Since(start).Round(time.Millisecond))
	if got := shedding(); got != 0 {
		t.Fatalf("keyway_memory_guard_shedding = %v after the guard let go, want 0", got)
	}
	wantServed(t, "a request after the guard let go", c.send(kb[0], "small"), b.name)
	if got := localResponses(adm, "memory"); got != 1 {
		t.Fatalf("keyway_local_responses_total{reason=memory} = %v, want 1", got)
	}
}
