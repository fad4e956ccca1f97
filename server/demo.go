package server

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"keyway/fleetauth"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"keyway/admin"
	"keyway/agent"
	"keyway/config"
	"keyway/demo"
	"keyway/logging"
)

// Demo is keyway's first-try setup: a proxy node and, for every replica
// set, as many built-in demo replicas as the set declares (orders-0,
// orders-1, ...), each behind its own agent, all on loopback and found by
// gossip. Build it with NewDemo and run it once with Run.
type Demo struct {
	// Proxy is the demo's proxy node; its addresses are known from NewDemo
	// on.
	Proxy *ProxyNode
	// TokenFile holds the admin token NewDemo made for this run, so that
	// drain, undrain and scale can be tried; "" when the configuration or
	// the environment names a token, or the admin API is off. Run removes
	// it when it returns.
	TokenFile string
	// CredentialsFile holds the fleet credentials NewDemo made for this
	// run (gossip is signed as off loopback); "" when the configuration
	// names a file. Run removes it when it returns.
	CredentialsFile string

	dir      string // the run's private directory ("" before writeFile)
	cfg      config.Config
	logs     *logging.Loggers
	replicas []demoReplica
}

type demoReplica struct {
	set string
	r   *demo.Replica
}

// NewDemo builds the demo from cfg, which must enable gossip: it opens the
// demo replicas' listeners (127.0.0.1, any free port) and builds the proxy
// node (see NewProxy).
func NewDemo(cfg config.Config, opts Options) (_ *Demo, err error) {
	if !cfg.Gossip.Enabled {
		return nil, errors.New("the demo runs its replicas behind agents: gossip.enabled must be true")
	}
	logs, err := logging.New(cfg.Log, orDiscard(opts.Stderr), orDiscard(opts.Stdout))
	if err != nil {
		return nil, err
	}
	d := &Demo{cfg: cfg, logs: logs}
	defer func() {
		if err != nil {
			for _, dr := range d.replicas {
				_ = dr.r.Close()
			}
			d.removeToken()
			logs.Close()
		}
	}()
	if _, ok := os.LookupEnv(admin.TokenEnv); !ok && cfg.Admin.TokenFile == "" && cfg.Admin.Listen != "" {
		if d.TokenFile, err = d.writeFile("admin-token", []byte(rand.Text()+"\n")); err != nil {
			return nil, err
		}
		cfg.Admin.TokenFile = d.TokenFile
	}
	if cfg.Gossip.CredentialsFile == "" {
		// The demo's fleet signs its gossip as a real one does: fresh
		// credentials for this run, every key in one file (the proxy's
		// and each set's agents'), on loopback in a private directory.
		var sets []string
		for _, s := range cfg.ReplicaSets {
			sets = append(sets, s.Name)
		}
		creds := fleetauth.Generate(sets).Marshal("keyway demo: this run's fleet credentials (every private key: for the demo only)")
		if d.CredentialsFile, err = d.writeFile("credentials.yaml", creds); err != nil {
			return nil, err
		}
		cfg.Gossip.CredentialsFile = d.CredentialsFile
		d.cfg.Gossip.CredentialsFile = d.CredentialsFile
	}
	for _, set := range cfg.ReplicaSets {
		keyHdr := ""
		for _, k := range set.Key {
			if k.Header != "" {
				keyHdr = k.Header
				break
			}
		}
		for i := 0; i < set.Replicas; i++ {
			r, err := demo.Listen(fmt.Sprintf("%s-%d", set.Name, i), "127.0.0.1:0", keyHdr)
			if err != nil {
				return nil, err
			}
			d.replicas = append(d.replicas, demoReplica{set: set.Name, r: r})
		}
	}
	if d.Proxy, err = NewProxy(cfg, opts); err != nil {
		return nil, err
	}
	return d, nil
}

// Run runs the demo replicas and the proxy node, and once the proxy's
// gossip node is up, one agent per demo replica joined to it; until ctx is
// done.
func (d *Demo) Run(ctx context.Context) error {
	defer d.logs.Close()
	defer d.removeToken()
	g, gctx := errgroup.WithContext(ctx)
	for _, dr := range d.replicas {
		g.Go(func() error { return dr.r.Run(gctx) })
	}
	g.Go(func() error { return d.Proxy.Run(gctx) })
	g.Go(func() error {
		select {
		case <-d.Proxy.GossipStarted():
		case <-gctx.Done():
			return nil
		}
		for _, dr := range d.replicas {
			a, err := buildAgent(d.agentConfig(dr, d.Proxy.GossipAddr()), agentDeps{
				log: d.logs.App.Named("agent"), reg: prometheus.NewRegistry(), stdout: io.Discard, stderr: io.Discard,
			})
			if err != nil {
				return err
			}
			g.Go(func() error { return a.Run(gctx) })
		}
		return nil
	})
	return g.Wait()
}

// agentConfig is the configuration of a demo replica's agent: quick
// probes, a short drain, no HTTP listener, the proxy's gossip settings.
func (d *Demo) agentConfig(dr demoReplica, join string) agent.Config {
	c := agent.DefaultConfig()
	c.Replica.Set, c.Replica.Name, c.Replica.Addr = dr.set, dr.r.Name(), dr.r.Addr()
	c.Probe.Interval = 200 * time.Millisecond
	c.Drain.Timeout = 5 * time.Second
	c.Listen = ""
	c.Log = d.cfg.Log
	c.Gossip = d.cfg.Gossip.Config
	c.Gossip.BindPort = 0
	c.Gossip.Join = []string{join}
	return c
}

// writeFile writes a file of this run (the admin token, the
// credentials) to the demo's private directory, made on first use, and
// returns its path.
func (d *Demo) writeFile(name string, b []byte) (string, error) {
	if d.dir == "" {
		dir, err := os.MkdirTemp("", "keyway-demo-")
		if err != nil {
			return "", err
		}
		d.dir = dir
	}
	file := filepath.Join(d.dir, name)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		return "", err
	}
	return file, nil
}

// removeToken removes the demo's private directory (the admin token and
// the credentials).
func (d *Demo) removeToken() {
	if d.dir != "" {
		_ = os.RemoveAll(d.dir)
	}
}
