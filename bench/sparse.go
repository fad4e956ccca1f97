package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// sparseRun is a proxy's cost for many keep-alive clients that each send
// seldom: -sparse-conns connections, each sending one keyed GET every
// -sparse-period, spread evenly over the period. Each request finds its
// connection idle for the whole period, so a proxy that does something
// with idle connections (keyway parks them after server.park_idle_after)
// pays for it on every request here.
type sparseRun struct {
	Conns         int     `json:"conns"`
	PeriodSeconds float64 `json:"period_seconds"`
	Requests      int64   `json:"requests"`
	Errors        int64   `json:"errors"`
	Rate          float64 `json:"rate"` // requests per second over the measured part
	CPUPerReqUS   float64 `json:"proxy_cpu_us_per_request"`
	CPUUtil       float64 `json:"proxy_cpu_util"`
}

// runSparse opens the connections, lets every one of them send for warm
// (at least one period, so that each has been idle for a whole period
// once), then measures the proxy's CPU (pid's process tree) for d.
func runSparse(ctx context.Context, addr string, conns, keys int, period, warm, d time.Duration, pid int) (sparseRun, error) {
	sr := sparseRun{Conns: conns, PeriodSeconds: period.Seconds()}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sent, errs atomic.Int64
	var measuring atomic.Bool
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	dial := &net.Dialer{Timeout: 5 * time.Second}
	start := time.Now()
	for i := range conns {
		wg.Go(func() {
			// Spread the connections' sends evenly over one period.
			offset := time.Duration(i) * period / time.Duration(conns)
			select {
			case <-ctx.Done():
				return
			case <-time.After(offset):
			}
			err := sparseClient(ctx, dial, addr, keyName(i%keys), period, &sent, &measuring)
			if err != nil && ctx.Err() == nil {
				errs.Add(1)
				once.Do(func() { firstErr = fmt.Errorf("connection %d: %w", i, err) })
			}
		})
	}
	select {
	case <-ctx.Done():
	case <-time.After(warm - time.Since(start)):
	}
	cpu0, err := treeCPU(pid)
	if err != nil {
		return sr, err
	}
	t0 := time.Now()
	measuring.Store(true)
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	measuring.Store(false)
	secs := time.Since(t0).Seconds()
	cpu1, err := treeCPU(pid)
	cancel()
	wg.Wait()
	if err != nil {
		return sr, err
	}
	sr.Requests, sr.Errors = sent.Load(), errs.Load()
	if sr.Requests == 0 {
		return sr, errors.Join(errors.New("no request answered"), firstErr)
	}
	sr.Rate = float64(sr.Requests) / secs
	sr.CPUPerReqUS = (cpu1 - cpu0) / float64(sr.Requests) * 1e6
	sr.CPUUtil = (cpu1 - cpu0) / secs
	return sr, nil
}

// sparseClient sends one request every period on one keep-alive
// connection until ctx ends, counting answers while measuring is set.
func sparseClient(ctx context.Context, dial *net.Dialer, addr, key string, period time.Duration, sent *atomic.Int64, measuring *atomic.Bool) error {
	c, err := dial.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	br := bufio.NewReaderSize(c, 1024)
	req := keyedGetRequest(addr, key)
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		if err := keyedGet(c, br, req); err != nil {
			return err
		}
		if measuring.Load() {
			sent.Add(1)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
