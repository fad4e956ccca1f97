package server

import (
	"cmp"
	"net"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"keyway/admin"
	"keyway/config"
	"keyway/eventlog"
	"keyway/runner"
)

// The local runner (package runner): a set with a run section has its
// replicas started here, one agent each, by the proxy process that holds
// the set's state directory lock.

// newRunner builds the node's runner: its agents join this proxy's gossip
// (and the file's join addresses), sign with its credentials unless the
// set names others, and log as it does.
func (n *ProxyNode) newRunner(cfg config.Config, opts Options) (*runner.Runner, error) {
	g := cfg.Gossip.Config
	bind := g.BindAddr
	if ip := net.ParseIP(bind); ip == nil || ip.IsUnspecified() {
		bind = "127.0.0.1"
	}
	return runner.New(runner.Options{
		Executable: opts.Executable,
		Logger:     n.log.Named("runner"),
		Registerer: n.reg,
		StopOnExit: opts.StopJobsOnExit,
		StateDir:   opts.JobsStateDir,
		Ready:      func() bool { return started(n.node.Started()) && n.rt.Synced() },
		Adopted: func(gossip []string) {
			if k, err := n.node.Join(gossip); err != nil && k == 0 {
				n.log.Named("runner").Warn("the adopted agents' gossip addresses not joined", zap.Strings("gossip", gossip), zap.Error(err))
			}
		},
		Event: func(set, replica string, fields map[string]any) {
			n.audit.Record(eventlog.KindReplicaJob, set, replica, fields)
		},
		Agent: runner.AgentBase{
			Join: func() []string {
				// This proxy's own gossip address first, on a dialable host.
				_, port, err := net.SplitHostPort(n.node.GossipAddr())
				if err != nil {
					return g.Join
				}
				return append([]string{net.JoinHostPort(bind, port)}, g.Join...)
			},
			BindAddr: bind, AdvertiseAddr: g.AdvertiseAddr, Label: g.Label, KeyFile: g.KeyFile, Insecure: g.Insecure,
			Credentials: g.CredentialsFile, Signatures: g.Signatures, Profile: g.Profile,
			LogLevel: cfg.Log.Level, LogFormat: cfg.Log.Format, ExitWithParent: opts.StopJobsOnExit,
		},
	})
}

// applyRunner tells the runner what the sets ask for.
func (n *ProxyNode) applyRunner(eff config.Config) {
	if n.runner == nil {
		return
	}
	var wants []runner.Want
	for _, sc := range eff.ReplicaSets {
		if sc.Run.Enabled() {
			wants = append(wants, runner.Want{Set: sc.Name, Replicas: sc.Replicas, Spec: sc.Run})
		}
	}
	n.runner.Apply(wants)
	n.phases.SetRun(runSets(eff))
}

// runSets names the sets with a run section.
func runSets(eff config.Config) map[string]bool {
	out := map[string]bool{}
	for _, sc := range eff.ReplicaSets {
		if sc.Run.Enabled() {
			out[sc.Name] = true
		}
	}
	return out
}

// jobNames names the replicas a set with a run section asks for (nil for
// a set without one): a rolling restart leaves out one a scale-in is
// removing.
func (n *ProxyNode) jobNames(set string) map[string]bool {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	for _, sc := range n.eff.ReplicaSets {
		if sc.Name == set && sc.Run.Enabled() {
			out := make(map[string]bool, sc.Replicas)
			for i := range sc.Replicas {
				out[runner.ReplicaName(set, i)] = true
			}
			return out
		}
	}
	return nil
}

var _ admin.Jobber = (*view)(nil)

// Jobs lists a set's jobs: the runner's view of each agent, with what
// the agent reported about its replica's process (the replica_process
// events) and the replica's lifecycle state in this proxy's table.
func (v *view) Jobs(set string) (admin.JobsStatus, error) {
	n := v.n
	r := n.p.Router(set)
	if r == nil {
		return admin.JobsStatus{}, admin.ErrUnknownSet
	}
	out := admin.JobsStatus{Set: set, Jobs: []admin.Job{}}
	if _, ok := n.isKubeSet(set); ok && n.kube != nil {
		n.kubeJobs(set, &out)
		return out, nil
	}
	if n.runner == nil {
		return out, nil
	}
	jobs, st := n.runner.Jobs(set)
	out.Runs, out.Here, out.StateDir, out.Holder, out.Error, out.Wanted = st.Runs, st.Here, st.StateDir, st.Holder, st.Error, st.Wanted
	members := map[string]string{}
	for _, m := range r.Table().Members() {
		members[m.Name] = m.State.String()
	}
	now := time.Now()
	for _, j := range jobs {
		aj := admin.Job{
			Replica: j.Replica, Ordinal: j.Ordinal, State: j.State, ReplicaState: members[j.Replica], Addr: j.Addr,
			AgentPid: j.AgentPid, Since: j.Since, Adopted: j.Adopted, AgentRestarts: j.Restarts, AgentLastExit: j.LastExit,
			RetryAt: j.RetryAt, Error: j.Error, StateDir: j.StateDir, Log: j.Log,
		}
		if !j.Since.IsZero() && j.AgentPid != 0 {
			aj.Age = now.Sub(j.Since).Round(time.Second).String()
		}
		n.processFacts(&aj, j)
		out.Jobs = append(out.Jobs, aj)
	}
	return out, nil
}

// processFacts fills in what the job's agent reported of its replica's
// process since the agent started: its PID, its restarts and its last
// exit. The reports are taken in the agent's order (seq, per agent
// process): they may arrive out of it, and a restart's exit and start
// come a millisecond apart.
func (n *ProxyNode) processFacts(aj *admin.Job, j runner.Job) {
	since := j.Since.Add(-time.Second)
	var evs []eventlog.Event
	rank := map[string]int{} // agent processes (gossip node names), in the order first heard of
	for _, e := range n.audit.Recent(since, []string{eventlog.KindReplicaProcess}, 0) {
		if e.Set != j.Set || e.Replica != j.Replica {
			continue
		}
		member := toString(e.Fields["member"])
		if _, ok := rank[member]; !ok {
			rank[member] = len(rank)
		}
		evs = append(evs, e)
	}
	slices.SortStableFunc(evs, func(a, b eventlog.Event) int {
		if c := cmp.Compare(rank[toString(a.Fields["member"])], rank[toString(b.Fields["member"])]); c != 0 {
			return c
		}
		return cmp.Compare(intField(a.Fields["seq"]), intField(b.Fields["seq"]))
	})
	for _, e := range evs {
		switch e.Fields["event"] {
		case "start":
			aj.Pid = intField(e.Fields["pid"])
		case "exit":
			aj.Pid = 0
			aj.LastExit = exitText(e.Fields)
			aj.LastExitAt = e.Time
		case "restart", "give_up":
			aj.Restarts = intField(e.Fields["restarts"])
		case "repair":
			aj.Restarts = 0
		}
	}
}

// started reports whether c is closed.
func started(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func intField(v any) int {
	switch x := v.(type) {
	case int:
		return x
	case int64:
		return int(x)
	case uint64:
		return int(x)
	case float64:
		return int(x)
	}
	return 0
}

// exitText says how a replica process ended, from a replica_process exit
// event's fields: "stopped (code 0)", "exit code 3", "killed by SIGKILL",
// "not started: ...".
func exitText(f map[string]any) string {
	reason, _ := f["reason"].(string)
	how := ""
	switch {
	case f["signal"] != nil:
		how = "killed by " + toString(f["signal"])
	case f["error"] != nil:
		how = toString(f["error"])
	case f["code"] != nil:
		how = "code " + strconv.Itoa(intField(f["code"]))
	}
	switch reason {
	case "stop":
		return "stopped by its agent (" + how + ")"
	case "exit_code":
		return "exit " + how
	case "start_error":
		return "not started: " + how
	}
	return how
}

func toString(v any) string {
	s, _ := v.(string)
	return s
}
