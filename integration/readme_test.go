package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"keyway/admin"
	"keyway/config"
	"keyway/demo"
	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
)

// TestReadmeDemoExamples checks the README's quick start and the
// operations guide against a real demo: the first order-42 answer is
// byte for byte the README's, the route example's owner, hash, partition
// and candidate order are what the demo computes (the ring depends only
// on the replicas' names and the hash configuration, so they hold on
// every run), and the walk-through "See ejection and recovery" behaves as
// written: exactly as many 500s as the README shows (five, the demo's
// health.passive.consecutive_failures) before orders-0 is ejected, its
// stand-in orders-2 in the meantime, orders-0 again once the ejection
// runs out, and the same through the readiness switch. The ejection is
// shortened to 1 s (the README's demo has 10 s) so that the test does not
// wait.
func TestReadmeDemoExamples(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadBytes(demo.ConfigName, demo.ConfigYAML, config.WithSet("listen", "127.0.0.1:0"),
		config.WithSet("admin.listen", "127.0.0.1:0"), config.WithSet("gossip.bind_port", "0"), config.WithSet("log.level", "warn"),
		config.WithSet("health.passive.base_ejection", "1s"))
	if err != nil {
		t.Fatal(err)
	}
	d := stacktest.StartDemo(t, cfg, Binary, "orders", 3)

	send := func(body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+d.Proxy+"/ingest", strings.NewReader(body))
		req.Header.Set("X-Key", "order-42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}

	// The README's first answer.
	first := regexp.MustCompile(`(?m)^\{"replica":"[^"]+","key":"order-42".*"requests":1\}$`).Find(readme)
	if first == nil {
		t.Fatal("README.md has no first order-42 answer (a line {\"replica\":…,\"key\":\"order-42\",…,\"requests\":1})")
	}
	if code, got := send("hello"); code != 200 || got != string(first) {
		t.Fatalf("the README's curl answers %d %s\nthe README shows      %s", code, got, first)
	}

	// The route example of docs/operations.md.
	var ex admin.RouteExplain
	stacktest.GetJSON(t, "http://"+d.Admin+"/v1/route?set=orders&key=order-42", &ex)
	var names []string
	for _, c := range ex.Candidates {
		names = append(names, c.Name)
	}
	for _, want := range []string{
		`key:       "order-42"`,
		fmt.Sprintf("hash:      %s (partition %d)", ex.Hash, ex.Partition),
		"owner:     " + ex.Owner,
		fmt.Sprintf("1  %s ", names[0]), fmt.Sprintf("2  %s ", names[1]), fmt.Sprintf("3  %s ", names[2]),
	} {
		if !strings.Contains(string(ops), want) {
			t.Errorf("docs/operations.md's route example lacks %q (the demo's route of order-42: owner %s, candidates %v)", want, ex.Owner, names)
		}
	}
	if ex.Owner != "orders-0" || names[1] != "orders-2" {
		t.Fatalf("order-42: owner %s, candidates %v; the README's walk-through has orders-0 with stand-in orders-2", ex.Owner, names)
	}

	var reps admin.ReplicaList
	stacktest.GetJSON(t, "http://"+d.Admin+"/v1/replica_sets/orders/replicas", &reps)
	var r0 string
	for _, r := range reps.Replicas {
		if r.Name == "orders-0" {
			r0 = r.Addr
		}
	}
	fault := func(path string) string {
		t.Helper()
		resp, err := http.Post("http://"+r0+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	answeredBy := func() (int, string) {
		code, body := send("hi")
		if m := regexp.MustCompile(`"replica":"([^"]+)"`).FindStringSubmatch(body); m != nil {
			return code, m[1]
		}
		return code, body
	}

	// The 500 switch: the README's 500s relayed, as many as
	// health.passive.consecutive_failures, then the stand-in. The request
	// whose failure reaches the threshold ejects orders-0 before its 500 is
	// relayed (waiting for the next passive sweep would let a sixth
	// request or more reach orders-0, unlike the README's transcript).
	loop := regexp.MustCompile(`(?m)^((?:500 )+)(?:200 ?)+$`).FindSubmatch(readme)
	if loop == nil {
		t.Fatal("README.md has no transcript of the 500 loop (a line of 500s then 200s)")
	}
	wantFives := strings.Count(string(loop[1]), "500")
	if n := cfg.Health.Passive.ConsecutiveFailures; wantFives != n {
		t.Errorf("the README's loop shows %d 500s; the demo's health.passive.consecutive_failures is %d", wantFives, n)
	}
	if got := fault("/_mode?v=500"); got != `{"mode":"500"}` {
		t.Fatalf("POST /_mode?v=500 answered %s", got)
	}
	fives := 0
	poll.Until(t, 10*time.Second, "orders-2 answers order-42 while orders-0 fails", func() bool {
		code, who := answeredBy()
		if code == 500 {
			fives++
			return false
		}
		if code != 200 || who != "orders-2" {
			t.Fatalf("while orders-0 answers 500: %d from %s, want 500 or orders-2's 200", code, who)
		}
		return true
	})
	t.Logf("%d 500s before orders-2 answered", fives)
	if fives != wantFives {
		t.Errorf("%d 500s before the ejection, want %d as the README shows (health.passive.consecutive_failures)", fives, wantFives)
	}
	if got := fault("/_mode?v=ok"); got != `{"mode":"ok"}` {
		t.Fatalf("POST /_mode?v=ok answered %s", got)
	}
	poll.Until(t, 10*time.Second, "orders-0 answers order-42 again after its ejection", func() bool {
		_, who := answeredBy()
		return who == "orders-0"
	})

	// The readiness switch: recovering on its agent, the stand-in, back.
	if got := fault("/_ready?v=false"); got != `{"ready":false}` {
		t.Fatalf("POST /_ready?v=false answered %s", got)
	}
	poll.Until(t, 10*time.Second, "orders-0 recovering and order-42 on orders-2", func() bool {
		var reps admin.ReplicaList
		stacktest.GetJSON(t, "http://"+d.Admin+"/v1/replica_sets/orders/replicas", &reps)
		_, who := answeredBy()
		return reps.Replicas[0].State == "recovering" && reps.Replicas[0].Reason == "state recovering" && who == "orders-2"
	})
	if got := fault("/_ready?v=true"); got != `{"ready":true}` {
		t.Fatalf("POST /_ready?v=true answered %s", got)
	}
	poll.Until(t, 10*time.Second, "orders-0 ready and answering order-42 again", func() bool {
		_, who := answeredBy()
		return who == "orders-0"
	})
}
