// Package agent is keyway's sidecar runtime (`keyway agent`): it runs
// beside one replica of a replica set, joins the gossip cluster as a member
// with role replica, probes the replica's readiness over HTTP and
// advertises the replica's address and lifecycle state to every proxy.
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
//
// and with a supervised process: process exit → recovering, process
// start → starting, give-up → failed (see step).
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
// supervise.stop_grace, then stopped. child.go turns the supervisor's
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
// # Concurrency
//
// Run owns every goroutine it starts: the gossip member, the probe loop
// (one probe in flight at most, first probe jittered), the HTTP server
// and the supervisor.
// The state machine is driven by Run's goroutine only. Drain reports
// arrive through membership's MessageHandler (its worker goroutine, never
// memberlist's callbacks), are stored under a mutex and signal the run
// loop without blocking.
package agent
