package server

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"

	"keyway/admin"
	"keyway/config"
	"keyway/fleetauth"
	"keyway/logging"
)

// Demo is keyway's first-try setup: a proxy node whose local runner runs,
// for every replica set, as many built-in demo replicas as the set asks for
// (orders-0, orders-1, ...: `keyway replica`), each behind its own agent
// (`keyway agent`), all on loopback and found by gossip, exactly as a
// set's run section runs them anywhere. Scale, restart, repair, stop and
// start act on real processes. Build it with NewDemo and run it once with
// Run; the jobs stop with it.
type Demo struct {
	// Proxy is the demo's proxy node; its addresses are known from NewDemo
	// on.
	Proxy *ProxyNode
	// TokenFile holds the admin token NewDemo made for this run, so that
	// the commands that change things can be tried; "" when the
	// configuration or the environment names a token, or the admin API is
	// off. Run removes it when it returns.
	TokenFile string
	// CredentialsFile holds the fleet credentials NewDemo made for this
	// run (gossip is signed as off loopback); "" when the configuration
	// names a file. Run removes it when it returns.
	CredentialsFile string
	// StateDir holds the replicas' state directories and the runner's
	// files (their logs) for the sets whose run section names none. Run
	// removes it when it returns.
	StateDir string

	dir  string // the run's private directory ("" before writeFile)
	logs *logging.Loggers
}

// NewDemo builds the demo from cfg, which must enable gossip: it makes the
// run's private directory (token, credentials, state) and builds the proxy
// node (see NewProxy), whose runner starts the replicas once it runs.
func NewDemo(cfg config.Config, opts Options) (_ *Demo, err error) {
	if !cfg.Gossip.Enabled {
		return nil, errors.New("the demo runs its replicas behind agents: gossip.enabled must be true")
	}
	logs, err := logging.New(cfg.Log, orDiscard(opts.Stderr), orDiscard(opts.Stdout))
	if err != nil {
		return nil, err
	}
	d := &Demo{logs: logs}
	defer func() {
		if err != nil {
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
	}
	// The replicas' state lives in the run's directory, unless a set says
	// otherwise (sets created at run time too): a demo's jobs are its
	// own, and go with it, even when it is killed (exit_with_parent).
	if _, err := d.writeFile(".keep", nil); err != nil {
		return nil, err
	}
	d.StateDir = filepath.Join(d.dir, "run")
	opts.StopJobsOnExit, opts.JobsStateDir = true, d.StateDir
	if d.Proxy, err = NewProxy(cfg, opts); err != nil {
		return nil, err
	}
	return d, nil
}

// Run runs the proxy node, whose runner starts the demo replicas once its
// gossip is up, until ctx is done; then the replicas stop with it.
func (d *Demo) Run(ctx context.Context) error {
	defer d.logs.Close()
	defer d.removeToken()
	return d.Proxy.Run(ctx)
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

// removeToken removes the demo's private directory (the admin token, the
// credentials and the replicas' state).
func (d *Demo) removeToken() {
	if d.dir != "" {
		_ = os.RemoveAll(d.dir)
	}
}
