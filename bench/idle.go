package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// idleRun is the memory a proxy needs for idle keep-alive client
// connections.
type idleRun struct {
	Conns        int     `json:"conns"`
	RSSBefore    int64   `json:"rss_before_bytes"`
	RSSWith      int64   `json:"rss_with_bytes"`
	BytesPerConn float64 `json:"bytes_per_conn"`
	OpenSeconds  float64 `json:"open_seconds"`
	// For keyway, from its own /metrics: where the memory went.
	GoBefore *goMem `json:"go_before,omitempty"`
	GoWith   *goMem `json:"go_with,omitempty"`
}

// goMem is the Go runtime's view of a process's memory, from the
// Prometheus Go collector on keyway's admin listener.
type goMem struct {
	Goroutines float64 `json:"goroutines"`
	HeapInuse  float64 `json:"heap_inuse_bytes"`
	StackInuse float64 `json:"stack_inuse_bytes"`
}

// scrapeGoMem reads goMem from a /metrics endpoint.
func scrapeGoMem(ctx context.Context, admin string) (*goMem, error) {
	b, err := httpGet(ctx, "http://"+admin+"/metrics")
	if err != nil {
		return nil, err
	}
	m := &goMem{}
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		var dst *float64
		switch name {
		case "go_goroutines":
			dst = &m.Goroutines
		case "go_memstats_heap_inuse_bytes":
			dst = &m.HeapInuse
		case "go_memstats_stack_inuse_bytes":
			dst = &m.StackInuse
		default:
			continue
		}
		if *dst, err = strconv.ParseFloat(strings.TrimSpace(val), 64); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return m, nil
}

// httpGet fetches url from a loopback admin endpoint.
func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, err
}

// openIdle opens n keep-alive connections to addr, sends one keyed GET on
// each and reads its answer, and leaves them open and idle. The caller
// closes them. Connections are opened by a bounded number of workers so
// that the listen backlog never overflows. With tf they are TLS
// connections, each a full handshake.
func openIdle(ctx context.Context, addr string, n, keyCount int, tf *tlsFiles) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	var dial func(context.Context, string, string) (net.Conn, error)
	if tf != nil {
		dial = (&tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: tf.clientConfig()}).DialContext
	} else {
		dial = (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	}
	for range min(32, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				c, err := oneRequestConn(ctx, dial, addr, keyName(i%keyCount))
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("connection %d of %d: %w", i+1, n, err) })
					next.Store(int64(n)) // stop the other workers
					return
				}
				conns[i] = c
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		closeAll(conns)
		return nil, firstErr
	}
	return conns, nil
}

func oneRequestConn(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), addr, key string) (net.Conn, error) {
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := keyedGet(c, bufio.NewReaderSize(c, 1024), keyedGetRequest(addr, key)); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// keyedGetRequest is the keyed GET the idle and sparse clients send.
func keyedGetRequest(addr, key string) []byte {
	return []byte("GET /ingest HTTP/1.1\r\nHost: " + addr + "\r\nX-Key: " + key + "\r\n\r\n")
}

// keyedGet sends req on the keep-alive connection c and reads its answer
// through br: an error unless it is 200 and leaves the connection open.
func keyedGet(c net.Conn, br *bufio.Reader, req []byte) error {
	if _, err := c.Write(req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return err
	case resp.StatusCode != 200:
		return fmt.Errorf("status %d", resp.StatusCode)
	case resp.Close:
		return errors.New("the server closed the keep-alive connection")
	}
	return nil
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

// settledRSS samples the RSS of pid's process tree every 200 ms until two
// samples in a row differ by less than 1%, or for at most limit; it
// returns the last sample.
func settledRSS(ctx context.Context, pid int, limit time.Duration) (int64, error) {
	m, err := treeMem(pid)
	if err != nil {
		return 0, err
	}
	prev := m.rss
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
		m, err := treeMem(pid)
		if err != nil {
			return 0, err
		}
		diff := m.rss - prev
		prev = m.rss
		if diff < 0 {
			diff = -diff
		}
		if float64(diff) < 0.01*float64(m.rss) {
			break
		}
	}
	return prev, nil
}
