// Package agent is keyway's sidecar runtime (`keyway agent`): it runs
// beside one replica of a replica set, joins the gossip cluster as a member
// with role replica, probes the replica's readiness over HTTP and
// advertises the replica's address and lifecycle state to every proxy.
// The package is the runtime and its parts; server.NewAgent
// (server/agent.go) wires them: New, a Supervisor with a command, and the
// gossip member (Attach).
//
// # Lifecycle
//
// The state machine (step, a pure function table-tested without a clock)
// follows design.md:
//
//	starting   --probe.rise consecutive passes-->    ready
//	ready      --probe.fall consecutive failures-->  recovering
//	recovering --probe.rise consecutive passes-->    ready
//	(any but stopped) --SIGTERM (Run's ctx done)-->  draining --drained--> stopped
//	starting, ready, recovering, failed --set stop--> draining --drained--> stopped
//	draining, stopped (set stop only) --set start--> starting
//
// and with a supervised process: process exit → recovering, process
// start → starting, give-up → failed (see step). Stopped is final except
// after a set stop.
//
// Every transition is logged ("replica state changed"), gossiped in the
// node metadata, exposed on /readyz (200 only when ready) and in the
// keyway_agent_state gauge.
//
// # Supervision
//
// Given a command (`keyway agent … -- CMD ARGS…`, Config.Command), the
// agent also runs the replica: supervise.go holds the supervisor, a loop
// that owns the process behind the small Process and StartFunc
// interfaces (exec_unix.go is the real one: own process group, output
// passed through) and a clock, so that its state machine is tested with
// fakes. It restarts the process after an unexpected exit with jittered
// exponential backoff, gives up after supervise.max_restarts restarts
// within supervise.window (state failed, until Repair), and stops it on
// shutdown only once the replica has drained: SIGTERM, then SIGKILL after
// supervise.stop_grace, then stopped. A set stop pauses it the same way
// (no restarts until a set start resumes it). child.go turns the supervisor's
// reports into lifecycle events (exit → recovering, start → starting,
// give-up → failed), logs, keyway_agent_child_* metrics and
// membership.ProcessEvent messages to every alive proxy (their audit
// trail's replica_process events).
//
// # Drain protocol
//
// On shutdown the agent advertises draining. Each proxy that sees it takes
// the replica out of rotation and, about every 200ms, sends the agent a
// [membership.DrainReport]: whether it has seen the drain and how many of its
// requests to the replica are still in flight. The agent waits until the
// latest report of every live proxy, received since the drain began, says
// DrainingSeen with nothing in flight, or until drain.timeout passes (and
// logs which proxies were still sending). With no proxy alive it is
// drained at once. It then waits drain.quiet, advertises stopped (with
// Remove when drain.remove is set: scale-in), leaves the cluster and Run
// returns.
//
// # Set stops
//
// An operator may stop a whole replica set; proxies then send its agents
// a [membership.SetStop] (and repeat it to every agent whose
// Meta.SetStopped differs from what the set wants). A stop drains the
// replica as a shutdown does (draining, advertised with SetStopped;
// every live proxy's report; drain.timeout; drain.quiet; the drain probe),
// then stops the supervised process without restarting it (it uses no
// restart budget) and advertises stopped; the agent keeps running. A
// start clears SetStopped and starts a fresh process (or, without one,
// lets the probes decide from starting); a start while the stop still
// drains abandons it and keeps the process. A command older than the
// newest applied (its Version) is ignored. setstop.go has the details.
//
// # Concurrency
//
// Run owns every goroutine it starts: the gossip member, the probe loop
// (one probe in flight at most, first probe jittered), the HTTP server,
// the supervisor, and a set stop's last steps (quiet period, drain probe,
// process stop), which run aside so that Run's loop keeps answering
// meanwhile. The state machine is driven by Run's goroutine only. Drain
// reports and commands arrive through membership's MessageHandler (its
// worker goroutine, never memberlist's callbacks), are stored under a
// mutex or in atomics and signal the run loop without blocking.
package agent
