// Package server is keyway's composition root: it builds the components of
// a process from its configuration, in one explicit order, runs them, and
// stops them in reverse.
//
//   - NewProxy builds a proxy node (proxy.go reads top to bottom as the
//     node starts): metrics and the audit trail, health checks and phases,
//     the proxy, the admin API and what it shows, gossip discovery. Run
//     starts them and stops them in stages; Reload (reload.go) applies a
//     changed configuration file while it runs.
//   - NewAgent builds an agent node, the sidecar beside one replica
//     (agent.go, buildAgent): the agent's runtime, the supervisor of the
//     replica's process when there is a command, and the gossip member
//     bound to the agent. The demo's agents are built the same way.
//   - NewDemo builds the first-try setup of `keyway demo`: a proxy node
//     and demo replicas behind agents, on loopback.
//
// The admin API's answers are shaped here from the components' own views
// (view.go, route.go, drain.go): the proxy explains a route with the
// function that routes and counts its traffic on its backends, membership
// owns drains and incarnations, the health checker its verdicts. The
// adapters that feed the audit trail from the components' callbacks are in
// audit.go. cmd/keyway parses flags and calls this package; nothing else
// imports it.
package server
