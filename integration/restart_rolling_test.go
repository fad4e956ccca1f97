package integration

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"keyway/admin"
	"keyway/internal/poll"
	"keyway/internal/slow"
)

// A rolling restart of a set of three supervised replicas, through two
// proxies, under a steady load through both: every replica gets a new
// process, no request fails, and every key is back on its owner.
func TestRollingRestartUnderLoad(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	a := StartProxy(t, "proxy-a", nil, 3)
	var reps []*SupervisedProc
	for i := range 3 {
		reps = append(reps, StartSupervisedReplica(t, fmt.Sprintf("orders-%d", i), []string{a.Gossip}))
	}
	a.WaitRotation(t, 3, 30*time.Second)
	b := StartProxy(t, "proxy-b", []string{a.Gossip}, 3)
	b.WaitRotation(t, 3, 30*time.Second)
	keys := Keys(500)
	c := NewClient()
	before := c.Owners(t, a.Addr, keys, 4)

	// A steady load through both proxies (about 300 req/s), until the
	// restart is over.
	var (
		stop     atomic.Bool
		sent     atomic.Int64
		mu       sync.Mutex
		failures []string
		wg       sync.WaitGroup
	)
	for w := range 2 {
		px := []string{a.Addr, b.Addr}[w]
		wg.Go(func() {
			lc := NewClient()
			for i := 0; !stop.Load() && i < 60000; i++ {
				<-time.After(6 * time.Millisecond)
				key := keys[(i*7+w)%len(keys)]
				sent.Add(1)
				code, _, err := lc.Send(px, key)
				if err != nil || code != 200 {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s via %s: %d %v", key, px, code, err))
					mu.Unlock()
				}
			}
		})
	}

	// The CLI, as an operator runs it; a second restart of the set while
	// it runs is refused.
	cl := &admin.Client{Addr: a.Admin, Token: "s3cret"}
	if _, _, err := cl.RestartStatus("orders"); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Fatalf("status before any restart: %v", err)
	}
	start := time.Now()
	second := make(chan struct{})
	go func() {
		defer close(second)
		poll.Within(10*time.Second, func() bool {
			st, _, err := cl.RestartStatus("orders")
			return err == nil && st.State == "running"
		})
		_, _, err := cl.Restart("orders", 0)
		mu.Lock()
		if err == nil || !strings.Contains(err.Error(), "HTTP 409") {
			failures = append(failures, fmt.Sprintf("a second restart while one runs: %v", err))
		}
		mu.Unlock()
	}()
	out, err := exec.Command(Binary, "restart", "--admin", a.Admin, "--set", "orders", "--step-timeout", "30s").CombinedOutput()
	took := time.Since(start)
	stop.Store(true)
	wg.Wait()
	<-second
	if err != nil {
		t.Fatalf("keyway restart: %v\n%s", err, out)
	}
	t.Logf("keyway restart:\n%s", out)
	for _, want := range []string{"orders-0", "orders-1", "orders-2", "drained", "started", "ready", "rolling restart of orders done"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("keyway restart printed no %q:\n%s", want, out)
		}
	}
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed during the rolling restart, e.g. %v", len(failures), sent.Load(), failures[:min(5, len(failures))])
	}
	for _, r := range reps {
		poll.Until(t, 10*time.Second, r.Name+"'s second process", func() bool { return len(r.ChildPids()) == 2 })
	}
	for _, px := range []*ProxyProc{a, b} {
		px.WaitRotation(t, 3, 10*time.Second)
		after := c.Owners(t, px.Addr, keys, 4)
		for _, k := range keys {
			if after[k] != before[k] {
				t.Fatalf("key %s: %s before the restart, %s after it through %s", k, before[k], after[k], px.Name)
			}
		}
	}
	st, _, err := (&admin.Client{Addr: a.Admin}).RestartStatus("orders")
	if err != nil || st.State != "done" || len(st.Steps) != 18 {
		t.Fatalf("restart status: %+v %v", st, err)
	}
	t.Logf("rolling restart of 3 supervised replicas through 2 proxies: %s, %d requests, none failed; every key back on its owner", took.Round(time.Millisecond), sent.Load())
}
