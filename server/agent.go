package server

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"keyway/agent"
	"keyway/config"
	"keyway/internal/buildinfo"
	"keyway/logging"
)

// AgentNode is one keyway agent process: the sidecar runtime beside one
// replica, with its logs and metrics. Build it with NewAgent and run it
// once with Run.
type AgentNode struct {
	logs *logging.Loggers
	log  *zap.Logger
	a    *agent.Agent
}

// NewAgent builds an agent node from cfg. It opens no listener and starts
// no goroutine; the agent binds its gossip and HTTP listeners in Run.
func NewAgent(cfg agent.Config, opts Options) (*AgentNode, error) {
	logs, err := logging.New(cfg.Log, orDiscard(opts.Stderr), orDiscard(opts.Stdout))
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(buildinfo.Collector()) // keyway_build_info{version,commit,go_version}
	// The supervised replica process (cfg.Command) writes to the agent's
	// own stdout and stderr.
	a, err := agent.New(cfg, agent.Options{Logger: logs.App.Named("agent"), Registerer: reg, Gatherer: reg,
		Stdout: orDiscard(opts.Stdout), Stderr: orDiscard(opts.Stderr)})
	if err != nil {
		logs.Close()
		return nil, err
	}
	logs.App.Info("keyway agent starting", zap.String("version", opts.Version), zap.String("config", config.AgentSummary(cfg)))
	return &AgentNode{logs: logs, log: logs.App, a: a}, nil
}

// Run runs the agent until ctx is done and the replica has drained (see
// agent.Agent.Run).
func (n *AgentNode) Run(ctx context.Context) error {
	defer n.logs.Close()
	if err := n.a.Run(ctx); err != nil {
		// No stack trace: the error says what failed (a taken port, say).
		n.log.WithOptions(zap.AddStacktrace(zapcore.FatalLevel)).Error("keyway agent stopped with an error", zap.Error(err))
		return err
	}
	return nil
}
