package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/internal/gossipfault"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
)

// No write silently lost. Three proxies; twenty rounds of opposite writes
// sent at the same moment through two of them, for scale and for
// stop/start: in every round either exactly one gets 200 and the other
// 409 (naming the winner), or both get 200 because they did not conflict
// and both took effect (one after the other: the fleet ends with the
// later). Then a proxy cut off from the others: its write answers 503
// "unconfirmed".
func TestConflictingWritesAreNeverLostSilently(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	sw := gossipfault.New()
	a := partitionProxy(t, nil, "", stacktest.Opts{})
	b := partitionProxy(t, []string{a.Gossip}, "", stacktest.Opts{})
	c := partitionProxy(t, []string{a.Gossip}, "", stacktest.Opts{GossipTransport: sw.Wrap})
	all := []*stacktest.Stack{a, b, c}
	for _, p := range all {
		poll.Until(t, 20*time.Second, "every proxy to see the three", func() bool { return proxiesSeen(t, p.Admin) == 3 })
	}
	type answer struct {
		code    int
		version uint64
		body    string
		took    time.Duration
	}
	write := func(p *stacktest.Stack, body string) answer {
		start := time.Now()
		req, _ := http.NewRequest(http.MethodPatch, "http://"+p.Admin+"/v1/replica_sets/orders", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer s3cret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var ch struct {
			Version uint64 `json:"version"`
		}
		_ = json.Unmarshal(raw, &ch)
		return answer{resp.StatusCode, ch.Version, string(raw), time.Since(start)}
	}
	settled := func() uint64 {
		var v uint64
		poll.Until(t, 10*time.Second, "the three proxies to hold one version", func() bool {
			va, vb, vc := setVersion(t, a.Admin), setVersion(t, b.Admin), setVersion(t, c.Admin)
			v = va
			return va == vb && vb == vc
		})
		return v
	}
	for _, kind := range []struct {
		name         string
		bodyA, bodyB string
	}{
		{"scale", `{"replicas":5}`, `{"replicas":6}`},
		{"stop/start", `{"stop":true}`, `{"stop":false}`},
	} {
		conflicts, sequential := 0, 0
		var took []time.Duration
		for round := range 20 {
			var ra, rb answer
			var wg sync.WaitGroup
			start := make(chan struct{})
			wg.Go(func() { <-start; ra = write(a, kind.bodyA) })
			wg.Go(func() { <-start; rb = write(b, kind.bodyB) })
			close(start)
			wg.Wait()
			took = append(took, ra.took, rb.took)
			final := settled()
			switch {
			case ra.code == 200 && rb.code == 409, ra.code == 409 && rb.code == 200:
				won, lost := ra, rb
				if rb.code == 200 {
					won, lost = rb, ra
				}
				if final != won.version || !strings.Contains(lost.body, strconv.FormatUint(won.version, 10)) {
					t.Fatalf("%s round %d: the fleet holds version %d, the winner answered %d, the loser %s", kind.name, round, final, won.version, lost.body)
				}
				conflicts++
			case ra.code == 200 && rb.code == 200:
				// No conflict: both took effect, one after the other.
				later := max(ra.version, rb.version)
				if ra.version == rb.version || final != later {
					t.Fatalf("%s round %d: both answered 200 (versions %d, %d) and the fleet holds %d: a write lost silently", kind.name, round, ra.version, rb.version, final)
				}
				sequential++
			default:
				t.Fatalf("%s round %d: answers %d %s / %d %s", kind.name, round, ra.code, ra.body, rb.code, rb.body)
			}
		}
		slices.Sort(took)
		t.Logf("%s: 20 rounds, %d conflicts answered 200 + 409, %d sequential (both 200, both applied in order), 0 silent losses; answer times median %s, max %s",
			kind.name, conflicts, sequential, took[len(took)/2].Round(10*time.Microsecond), took[len(took)-1].Round(10*time.Microsecond))
	}

	// C is cut off: its write is not confirmed.
	sw.Cut()
	got := write(c, `{"replicas":7}`)
	var refused struct {
		Unconfirmed bool `json:"unconfirmed"`
	}
	_ = json.Unmarshal([]byte(got.body), &refused)
	if got.code != http.StatusServiceUnavailable || !refused.Unconfirmed {
		t.Fatalf("a cut-off proxy's write: %d %s, want 503 unconfirmed", got.code, got.body)
	}
	sw.Heal()
	settled()
}

// proxiesSeen counts the alive proxies a proxy's gossip lists.
func proxiesSeen(t *testing.T, adminAddr string) int {
	t.Helper()
	var ms struct {
		Members []struct {
			Role   string `json:"role"`
			Status string `json:"status"`
		} `json:"members"`
	}
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/members", &ms)
	n := 0
	for _, m := range ms.Members {
		if m.Role == "proxy" && m.Status == "alive" {
			n++
		}
	}
	return n
}

// setVersion is orders' run-time version on a proxy, from its ETag.
func setVersion(t *testing.T, adminAddr string) uint64 {
	t.Helper()
	resp, err := http.Get("http://" + adminAddr + "/v1/replica_sets/orders")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	v, err := strconv.ParseUint(strings.Trim(resp.Header.Get("ETag"), `"`), 10, 64)
	if err != nil {
		t.Fatalf("ETag %q: %v", resp.Header.Get("ETag"), err)
	}
	return v
}

// A set deleted at run time: its requests get 410 Gone, through every
// proxy, not a broader set's replicas; until its record is cleared.
func TestDeletedSetIsGoneNotInherited(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	usersSet := `  - name: users
    replicas: 1
    match: {path_prefix: /users/}
    key: [{header: X-Key}]
`
	a := StartProxyWith(t, "proxy-a", nil, 1, usersSet)
	b := StartProxyWith(t, "proxy-b", []string{a.Gossip}, 1, usersSet)
	StartReplica(t, "orders-0", []string{a.Gossip})
	for _, p := range []*ProxyProc{a, b} {
		p.WaitRotation(t, 1, 30*time.Second)
	}
	req, _ := http.NewRequest(http.MethodDelete, "http://"+a.Admin+"/v1/replica_sets/users", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("delete users: %d %s", resp.StatusCode, body)
	}
	for _, p := range []*ProxyProc{a, b} {
		poll.Until(t, 10*time.Second, p.Name+" to answer /users/ 410", func() bool { return sendPath(t, p.Addr, "/users/1", "k") == http.StatusGone })
		if code := sendPath(t, p.Addr, "/orders/1", "k"); code != 200 {
			t.Fatalf("%s: /orders/ answered %d", p.Name, code)
		}
	}
	// Cleared, the file's set is served again.
	req, _ = http.NewRequest(http.MethodDelete, "http://"+b.Admin+"/v1/runtime/users", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("clear users: %v %v", resp, err)
	}
	resp.Body.Close()
	for _, p := range []*ProxyProc{a, b} {
		poll.Until(t, 10*time.Second, p.Name+" to serve users again", func() bool { return sendPath(t, p.Addr, "/users/1", "k") != http.StatusGone })
	}
}
