package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"keyway/agent"
	"keyway/config"
	"keyway/internal/buildinfo"
	"keyway/internal/flock"
	"keyway/logging"
	"keyway/membership"
	"keyway/runner"
)

// AgentNode is one keyway agent process: the sidecar runtime beside one
// replica, with its logs and metrics. Build it with NewAgent and run it
// once with Run.
type AgentNode struct {
	logs     *logging.Loggers
	log      *zap.Logger
	a        *agent.Agent
	lock     *flock.Lock      // lock_file, held until Run returns; nil without one
	lockInfo runner.AgentLock // what it says; the gossip address once known

	exitWithParent bool
}

// writeGossipAddr adds the agent's gossip address to its lock file once
// its member runs.
func (n *AgentNode) writeGossipAddr(ctx context.Context) {
	select {
	case <-n.a.Started():
	case <-ctx.Done():
		return
	}
	info := n.lockInfo
	info.Gossip = n.a.GossipAddr()
	b, _ := json.Marshal(info)
	if err := n.lock.Write(b); err != nil {
		n.log.Warn("lock_file not updated with the gossip address", zap.Error(err))
	}
}

// watchParent cancels the agent's context (it drains and exits) once the
// process that started it has exited: the agent's parent process changes
// (it is adopted by init or a subreaper).
func watchParent(ctx context.Context, cancel context.CancelFunc, log *zap.Logger) {
	parent := os.Getppid()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if p := os.Getppid(); p != parent {
				log.Info("the process that started this agent has exited; draining and leaving (exit_with_parent)", zap.Int("parent", parent))
				cancel()
				return
			}
		}
	}
}

// NewAgent builds an agent node from cfg: its logs, its metrics, and the
// agent (buildAgent). It opens no listener and starts no goroutine; the
// agent binds its gossip and HTTP listeners in Run.
func NewAgent(cfg agent.Config, opts Options) (_ *AgentNode, err error) {
	// lock_file first: a second agent of the same replica starts nothing.
	lock, err := lockAgent(cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && lock != nil {
			lock.Close()
		}
	}()
	logs, err := logging.New(cfg.Log, orDiscard(opts.Stderr), orDiscard(opts.Stdout))
	if err != nil {
		return nil, err
	}
	// One registry for the node, served on the agent's /metrics: Go
	// runtime, process, build info, and what the components register.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(buildinfo.Collector()) // keyway_build_info{version,commit,go_version}
	a, err := buildAgent(cfg, agentDeps{
		log: logs.App.Named("agent"), reg: reg,
		// The supervised replica process writes to the agent's own
		// stdout and stderr.
		stdout: orDiscard(opts.Stdout), stderr: orDiscard(opts.Stderr),
		transport: opts.GossipTransport,
	})
	if err != nil {
		logs.Close()
		return nil, err
	}
	logs.App.Info("keyway agent starting", zap.String("version", opts.Version), zap.String("config", config.AgentSummary(cfg)))
	return &AgentNode{logs: logs, log: logs.App, a: a, lock: lock, lockInfo: lockInfo(cfg), exitWithParent: cfg.ExitWithParent}, nil
}

func lockInfo(cfg agent.Config) runner.AgentLock {
	return runner.AgentLock{Pid: os.Getpid(), Set: cfg.Replica.Set, Replica: cfg.Replica.Name, Addr: cfg.Replica.Addr, Started: time.Now().UTC()}
}

// lockAgent takes cfg's lock_file, when it names one, and writes this
// process into it.
func lockAgent(cfg agent.Config) (*flock.Lock, error) {
	if cfg.LockFile == "" {
		return nil, nil
	}
	l, err := flock.TryLock(cfg.LockFile)
	if errors.Is(err, flock.ErrLocked) {
		holder := "another process"
		if b, rerr := os.ReadFile(cfg.LockFile); rerr == nil {
			var h runner.AgentLock
			if json.Unmarshal(b, &h) == nil && h.Pid > 0 {
				holder = fmt.Sprintf("pid %d (replica %s)", h.Pid, h.Replica)
			}
		}
		return nil, fmt.Errorf("lock_file: %s is held by %s: another agent runs this replica; stop it first, or give this agent another lock_file", cfg.LockFile, holder)
	}
	if err != nil {
		return nil, fmt.Errorf("lock_file: %w", err)
	}
	b, _ := json.Marshal(lockInfo(cfg))
	if err := l.Write(b); err != nil {
		l.Close()
		return nil, fmt.Errorf("lock_file: %w", err)
	}
	return l, nil
}

// agentDeps are what buildAgent wires an agent to.
type agentDeps struct {
	log *zap.Logger
	// reg receives every metric and is what /metrics serves.
	reg            *prometheus.Registry
	stdout, stderr io.Writer // the supervised process's output
	// transport wraps the gossip transport (Options.GossipTransport).
	transport func(*memberlist.NetTransport) memberlist.NodeAwareTransport
}

// buildAgent wires one agent, in the order its parts depend on each
// other. It is how every agent is built: a keyway agent process
// (NewAgent) and each demo replica's (demo.go). It binds nothing and
// starts nothing: the agent's Run binds its listeners, runs the gossip
// member and the supervisor, and stops them in reverse once the replica
// has drained.
func buildAgent(cfg agent.Config, d agentDeps) (*agent.Agent, error) {
	// 1. The runtime: it validates cfg, names the replica (replica.name,
	// else the host name), probes its readiness, drives the lifecycle
	// state machine, collects drain reports and serves /healthz, /readyz
	// and /metrics.
	a, err := agent.New(cfg, agent.Options{Logger: d.log, Registerer: d.reg, Gatherer: d.reg})
	if err != nil {
		return nil, err
	}

	// 2. With a command (`-- CMD`), the supervisor: it runs the replica's
	// process, restarts it with backoff and gives up as failed; the agent
	// turns its reports into lifecycle events and stops it once drained.
	if len(cfg.Command) > 0 {
		sup, err := agent.NewSupervisor(cfg.Command, cfg.Supervise, agent.SupervisorOptions{
			Start: agent.StartCommand(d.stdout, d.stderr), Logger: d.log.Named("supervisor"), Registerer: d.reg,
		})
		if err != nil {
			return nil, err
		}
		a.Supervise(sup)
	}

	// 3. Gossip: a member with role replica that advertises the replica
	// (its set, name, address and state: the agent's Meta). The agent is
	// its sink (member changes wake the drain) and its message handler
	// (drain reports, operator drains, set stops, repairs, restarts).
	node, err := membership.New(cfg.Gossip, a.Meta(), membership.Options{
		Logger: d.log.Named("gossip"), Registerer: d.reg, Sink: a, Transport: d.transport,
	})
	if err != nil {
		return nil, err
	}
	a.Attach(node)
	return a, nil
}

// Run runs the agent until ctx is done and the replica has drained (see
// agent.Agent.Run).
func (n *AgentNode) Run(ctx context.Context) error {
	defer n.logs.Close()
	if n.lock != nil {
		defer n.lock.Close()
		go n.writeGossipAddr(ctx)
	}
	if n.exitWithParent {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go watchParent(ctx, cancel, n.log)
	}
	if err := n.a.Run(ctx); err != nil {
		// No stack trace: the error says what failed (a taken port, say).
		n.log.WithOptions(zap.AddStacktrace(zapcore.FatalLevel)).Error("keyway agent stopped with an error", zap.Error(err))
		return err
	}
	return nil
}
