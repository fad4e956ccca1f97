package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Load sends keyed 1 KiB POSTs to a proxy at a steady rate from a
// keep-alive pool, as a producer would, and checks each answer: a 200
// from the replica that owns the key (Owners), and nothing else. Nothing
// is retried: a request lost on a closed connection counts as failed.
type Load struct {
	addr   func() string // the proxy's address
	keys   []string
	owners map[string]string // "" owner: any replica
	hc     *http.Client

	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	sent     int
	ok       int
	failures map[string]int // what went wrong, counted
	examples []string
}

// StartLoad sends rate requests a second for keys, each to addr(), until
// Stop. owners, if non-nil, is each key's replica.
func StartLoad(addr func() string, keys []string, owners map[string]string, rate int) *Load {
	l := &Load{addr: addr, keys: keys, owners: owners, stop: make(chan struct{}), failures: map[string]int{},
		hc: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 256}}}
	body := bytes.Repeat([]byte("p"), 1024)
	work := make(chan string, rate)
	for range 64 {
		l.wg.Go(func() {
			for key := range work {
				l.one(key, body)
			}
		})
	}
	l.wg.Go(func() {
		defer close(work)
		interval := time.Second / time.Duration(rate)
		t := time.NewTicker(interval)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			case <-t.C:
			}
			select {
			case work <- keys[i%len(keys)]:
			case <-l.stop:
				return
			}
		}
	})
	return l
}

func (l *Load) one(key string, body []byte) {
	req, _ := http.NewRequest("POST", "http://"+l.addr()+"/ingest", bytes.NewReader(body))
	req.Header.Set("X-Key", key)
	resp, err := l.hc.Do(req)
	fail := ""
	switch {
	case err != nil:
		fail = "error: " + err.Error()
	default:
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var a Answer
		switch {
		case resp.StatusCode != 200:
			fail = fmt.Sprintf("status %d: %s", resp.StatusCode, b)
		case json.Unmarshal(b, &a) != nil:
			fail = fmt.Sprintf("answer %q", b)
		case l.owners != nil && a.Replica != l.owners[key]:
			fail = fmt.Sprintf("key %s answered by %s, owner %s", key, a.Replica, l.owners[key])
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sent++
	if fail == "" {
		l.ok++
		return
	}
	kind := fail
	if i := strings.LastIndex(kind, ": "); strings.HasPrefix(kind, "error: ") && i > 0 {
		kind = "error: " + kind[i+2:] // the cause, without the URL
	}
	if len(kind) > 60 {
		kind = kind[:60]
	}
	l.failures[kind]++
	if len(l.examples) < 5 {
		l.examples = append(l.examples, fail)
	}
}

// FailedExcept returns how many requests failed for a reason that does
// not contain any of the texts.
func (l *Load) FailedExcept(texts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for kind, c := range l.failures {
		if !slices.ContainsFunc(texts, func(s string) bool { return strings.Contains(kind, s) }) {
			n += c
		}
	}
	return n
}

// Counts returns the requests answered so far and those that failed.
func (l *Load) Counts() (sent, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent, l.sent - l.ok
}

// Stop stops sending, waits for the requests in flight and returns a
// summary: "" when every request succeeded.
func (l *Load) Stop() (sent int, failures string) {
	close(l.stop)
	l.wg.Wait()
	l.hc.CloseIdleConnections()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ok == l.sent {
		return l.sent, ""
	}
	var kinds []string
	for k, n := range l.failures {
		kinds = append(kinds, fmt.Sprintf("%d× %s", n, k))
	}
	sort.Strings(kinds)
	return l.sent, fmt.Sprintf("%d of %d failed: %v; e.g. %q", l.sent-l.ok, l.sent, kinds, l.examples)
}
