package admin

import (
	"encoding/json"
	"time"
)

// The wire types of the admin API: every JSON answer under /v1/ is one of
// these values, documented field by field in docs/admin.md. They are plain
// values: the server fills them from the components' views, the CLI
// (Client) decodes them. A field added here is added to docs/admin.md.

// ErrorBody is every error answer: {"error": "..."}, with a message that
// says what to do.
type ErrorBody struct {
	Error string `json:"error"`
}

// SetList is the answer of GET /v1/replica_sets: every set without its
// replicas and traffic.
type SetList struct {
	ReplicaSets []SetStatus `json:"replica_sets"`
}

// ReplicaList is the answer of GET /v1/replica_sets/{set}/replicas.
type ReplicaList struct {
	Set      string          `json:"set"`
	Replicas []ReplicaStatus `json:"replicas"`
}

// MemberList is the answer of GET /v1/members.
type MemberList struct {
	Members []MemberInfo `json:"members"`
}

// EventList is the answer of GET /v1/events: audit events, newest first,
// each as the audit trail writes it (docs/audit.md).
type EventList struct {
	Events []any `json:"events"`
}

// ReloadRefused is the 422 answer of POST /v1/reload: the file was not
// applied, for every reason in Problems ("FILE:LINE: PATH: message").
type ReloadRefused struct {
	Error    string   `json:"error"`
	Problems []string `json:"problems"`
}

// SetStatus is one replica set as this proxy routes it. A plain value.
type SetStatus struct {
	Name string `json:"name"`
	// Phase is the set's lifecycle phase ("Created", "Running", ...).
	Phase string `json:"phase"`
	// Declared is the configured replica count.
	Declared int `json:"declared"`
	// Ready counts replicas that advertise ready and are not down,
	// whether or not this proxy holds them out of rotation.
	Ready int `json:"ready"`
	// InRotation counts replicas that may receive new requests now.
	InRotation int `json:"in_rotation"`
	// RingSize counts ring members (replicas that were ready once).
	RingSize int `json:"ring_size"`
	// Partitions is the ring's fixed partition count.
	Partitions int `json:"partitions"`
	// Failover is "next" or "strict".
	Failover string `json:"failover"`
	// Fingerprint identifies the ring's shape; proxies that agree on it and
	// on the ring members route every key the same way.
	Fingerprint string `json:"fingerprint"`
	// Generation increases with every routing table the set publishes.
	Generation uint64 `json:"generation"`
	// Traffic is what this proxy sent the set's replicas: totals and recent
	// rates. Only the one-set endpoint carries it (nil in the list).
	Traffic *SetTraffic `json:"traffic,omitempty"`
	// Replicas lists every known replica sorted by name ([] when none). The
	// list endpoint leaves it out (nil).
	Replicas []ReplicaStatus `json:"replicas,omitempty"`
	// Stopped says an operator stopped the set: every request gets 503.
	Stopped bool `json:"stopped"`
	// Source is "file" when the configuration file defines the set,
	// "runtime" when it was created at run time.
	Source string `json:"source"`
	// Runtime is set when the run-time state changes what the file says
	// about the set.
	Runtime *SetRuntime `json:"runtime,omitempty"`
	// Match is the set's match rule: the requests it takes.
	Match SetMatch `json:"match"`
	// Version is the version of the set's run-time record (0: it has
	// none), also the ETag of GET /v1/replica_sets/{set}: send it back as
	// If-Match with a write, which is then refused (409) if another write
	// came first. A hybrid logical clock above 2^53: read it as an integer.
	Version uint64 `json:"version"`
}

// SetMatch is a set's match rule: requests whose Host is Host (any host
// when "") and whose path starts with PathPrefix.
type SetMatch struct {
	Host       string `json:"host"`
	PathPrefix string `json:"path_prefix"`
}

// SetTraffic sums the traffic figures of a set's replicas (the rows of
// Replicas) and adds the requests this proxy answered itself for the set
// (no replica in rotation, no key, unreachable replicas: 4xx and 5xx
// answers with replica "none" in keyway_requests_total). A plain value.
//
// Rates are measured over WindowSeconds, the span between a fresh reading
// of the proxy's counters and an earlier stored one (about 10 s when the
// set is read often enough, between 1 s and 60 s otherwise). When no
// earlier reading is known yet the rates and WindowSeconds are null and
// RateNote says why; a rate is never reported as 0 without a measurement.
type SetTraffic struct {
	WindowSeconds         *float64 `json:"window_seconds"`
	RequestsPerSecond     *float64 `json:"requests_per_second"`
	ErrorsPerSecond       *float64 `json:"errors_per_second"`
	LocalAnswersPerSecond *float64 `json:"local_answers_per_second"`
	RequestsTotal         uint64   `json:"requests_total"`
	ErrorsTotal           uint64   `json:"errors_total"`
	LocalAnswersTotal     uint64   `json:"local_answers_total"`
	// ShedPerSecond and ShedTotal count the local answers that shed a
	// request: overload, replica-reported pressure, the memory guard.
	ShedPerSecond *float64 `json:"shed_per_second"`
	ShedTotal     uint64   `json:"shed_total"`
	// RateNote explains null rates ("" when they are known).
	RateNote string `json:"rate_note,omitempty"`
	// Codes counts the answers the set's clients got by status class
	// ("2xx", "4xx", …; the replicas' answers and keyway's own), and
	// CodesPerSecond their rates (null without rates).
	Codes          map[string]uint64  `json:"codes"`
	CodesPerSecond map[string]float64 `json:"codes_per_second"`
	// ClientErrorsTotal counts the 5xx answers clients got (a replica's or
	// keyway's own), and ClientErrorsPerSecond their rate. Unlike
	// ErrorsTotal, it leaves out failed exchanges that were retried.
	ClientErrorsTotal     uint64   `json:"client_errors_total"`
	ClientErrorsPerSecond *float64 `json:"client_errors_per_second"`
	// FailedAttemptsTotal counts failed exchanges with the replicas
	// (dial, stale_conn, timeout, …): each was retried on the next
	// candidate or answered by keyway, so no client saw it as such.
	FailedAttemptsTotal     uint64   `json:"failed_attempts_total"`
	FailedAttemptsPerSecond *float64 `json:"failed_attempts_per_second"`
	// P50LatencySeconds and P99LatencySeconds are the set's latency over
	// the window, from the replicas' latency histograms added up (null
	// without an answer in the window).
	P50LatencySeconds *float64 `json:"p50_latency_seconds"`
	P99LatencySeconds *float64 `json:"p99_latency_seconds"`
	// History is the set's traffic over the last 15 minutes on this
	// proxy, a point every 10 s, oldest first (kept in memory only).
	History []TrafficPoint `json:"history"`
}

// TrafficPoint is one step of a set's history: the rates over the 10 s
// before At.
type TrafficPoint struct {
	At time.Time `json:"at"`
	// RequestsPerSecond counts the answers clients got (the replicas' and
	// keyway's own), ClientErrorsPerSecond the 5xx among them.
	RequestsPerSecond     float64 `json:"requests_per_second"`
	ClientErrorsPerSecond float64 `json:"client_errors_per_second"`
	// P99LatencySeconds is null without an answer from a replica.
	P99LatencySeconds *float64 `json:"p99_latency_seconds"`
}

// ReplicaTraffic is what this proxy sent one replica. Totals count since
// the replica's metric series were created on this proxy (it joined this
// proxy's ring, or the proxy started); rates are as in [SetTraffic]. A
// plain value.
type ReplicaTraffic struct {
	WindowSeconds *float64 `json:"window_seconds"`
	// RequestsPerSecond is the rate of requests the replica answered (any
	// status); ErrorsPerSecond the rate of its 5xx answers plus failed
	// exchanges with it.
	RequestsPerSecond *float64 `json:"requests_per_second"`
	ErrorsPerSecond   *float64 `json:"errors_per_second"`
	// MeanLatencySeconds and P99LatencySeconds are the latency of the
	// answers it gave within the window (keyway_request_duration_seconds:
	// from receiving the request to having the answer ready, retries
	// included): the mean, and the 99th percentile estimated from the
	// histogram's buckets as histogram_quantile does. null without rates
	// or without an answer in the window.
	MeanLatencySeconds *float64 `json:"mean_latency_seconds"`
	P99LatencySeconds  *float64 `json:"p99_latency_seconds"`
	// RequestsTotal counts answers from the replica, any status
	// (keyway_requests_total).
	RequestsTotal uint64 `json:"requests_total"`
	// Responses5xxTotal counts its 5xx answers.
	Responses5xxTotal uint64 `json:"responses_5xx_total"`
	// TransportErrorsTotal counts failed exchanges with it, and
	// TransportErrors splits them by kind (dial, stale_conn, reused_closed,
	// no_free_conns, timeout, reset, other, tls_handshake, reply_too_large;
	// only kinds seen), as keyway_upstream_errors_total does. A failed
	// exchange is not an answer: the request went to the next candidate or
	// keyway answered it.
	TransportErrorsTotal uint64            `json:"transport_errors_total"`
	TransportErrors      map[string]uint64 `json:"transport_errors,omitempty"`
	// ErrorsTotal is Responses5xxTotal + TransportErrorsTotal.
	ErrorsTotal uint64 `json:"errors_total"`
	// Ejections counts passive ejections within the health checker's
	// supervision window (its snapshot); EjectionsTotal every passive
	// ejection since the replica's series were created
	// (keyway_ejections_total).
	Ejections      int    `json:"ejections"`
	EjectionsTotal uint64 `json:"ejections_total"`
	// Responses5xxPerSecond is the rate of its 5xx answers (clients got
	// them), FailedAttemptsPerSecond of failed exchanges with it (retried
	// on another candidate or answered by keyway): ErrorsPerSecond is
	// their sum.
	Responses5xxPerSecond   *float64 `json:"responses_5xx_per_second"`
	FailedAttemptsPerSecond *float64 `json:"failed_attempts_per_second"`
}

// ReplicaStatus is one replica of a set. A plain value.
type ReplicaStatus struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
	// State is the advertised lifecycle state ("ready", "draining", ...).
	State string `json:"state"`
	// Source says where the replica came from ("static", "gossip").
	Source string `json:"source,omitempty"`
	Zone   string `json:"zone,omitempty"`
	// Down says gossip finds the replica unreachable.
	Down bool `json:"down,omitempty"`
	// Slot is the replica's ring slot, or -1 when it is not on the ring.
	Slot int `json:"slot"`
	// InRotation says whether it may receive new requests now.
	InRotation bool `json:"in_rotation"`
	// Reason says why it is out of rotation ("" when in): its state, "down",
	// and the proxy-local exclusions ("excluded: probe+ejected").
	Reason string `json:"reason,omitempty"`
	// StateSince is when this proxy first saw the replica in its state,
	// and StateSeconds how long ago that was when the answer was made;
	// RotationSince and RotationSeconds the same for its place in or out
	// of rotation. A proxy that started or learned of the replica later
	// counts from then. Absent when unknown.
	StateSince      *time.Time `json:"state_since,omitempty"`
	StateSeconds    *float64   `json:"state_seconds,omitempty"`
	RotationSince   *time.Time `json:"rotation_since,omitempty"`
	RotationSeconds *float64   `json:"rotation_seconds,omitempty"`
	// Partitions is the number of partitions it owns on the ring, and Share
	// that number divided by the partition count (0..1).
	Partitions int     `json:"partitions"`
	Share      float64 `json:"share"`
	// Traffic is what this proxy sent it: requests, errors, ejections.
	Traffic *ReplicaTraffic `json:"traffic,omitempty"`
	// Inflight counts the requests this proxy is forwarding to it now;
	// FleetInflight adds those of the other proxies this one hears from
	// (their last views, at most fleet.interval old), and FleetProxies
	// says how many proxies that sum covers, this one included. A drain is
	// over on every proxy when FleetInflight is 0.
	Inflight      int64 `json:"inflight"`
	FleetInflight int64 `json:"fleet_inflight"`
	FleetProxies  int   `json:"fleet_proxies"`
	// Health is the health checker's view (probe verdict, ejections), or
	// nil when the checker does not track the replica.
	Health any `json:"health,omitempty"`
	// Why says, in a sentence, why the replica is out of rotation ("" when
	// it is in), e.g. "ejected after 5 failures in a row (5xx)".
	Why string `json:"why,omitempty"`
	// BackAt is when it comes back on its own (the end of an ejection or
	// of a supervision hold, if it then answers), and BackInSeconds how
	// long that is from the answer; absent when it waits on something
	// else (its agent, an operator).
	BackAt        *time.Time `json:"back_at,omitempty"`
	BackInSeconds *float64   `json:"back_in_seconds,omitempty"`
	// HeldBy lists the proxies whose evidence holds it out of the fleet's
	// rotation ("self" for this one; fleet.share), [] when none.
	HeldBy []string `json:"held_by,omitempty"`
}

// RouteExplain says where a key goes and why. A plain value.
type RouteExplain struct {
	Set string `json:"set"`
	Key string `json:"key"`
	// Hash is the key's 64-bit hash in hex (xxhash64, as proxies compute it).
	Hash      string `json:"hash"`
	Partition int    `json:"partition"`
	Failover  string `json:"failover"`
	// Owner is the ring owner of the key's partition, in rotation or not;
	// "" when the ring is empty.
	Owner string `json:"owner"`
	// Pick is the replica a request with this key goes to now (its first
	// attempt); "" when none may take it and keyway answers itself.
	Pick string `json:"pick"`
	// FailOpen says the pick was made by the all-down policy fail_open:
	// no replica of the set is in rotation, and the key goes to its ring
	// owner anyway.
	FailOpen bool `json:"fail_open,omitempty"`
	// AnswerStatus and Answer are keyway's own answer when Pick is "": the
	// status code and the error message of its JSON body.
	AnswerStatus int    `json:"answer_status,omitempty"`
	Answer       string `json:"answer,omitempty"`
	// Candidates are the ring members failover considers, owner first.
	Candidates  []RouteCandidate `json:"candidates"`
	Fingerprint string           `json:"fingerprint"`
	Generation  uint64           `json:"generation"`
}

// RouteCandidate is one replica in a key's failover order.
type RouteCandidate struct {
	Name       string `json:"name"`
	Addr       string `json:"addr"`
	State      string `json:"state"`
	InRotation bool   `json:"in_rotation"`
	// Picked marks the replica that takes the key.
	Picked bool `json:"picked,omitempty"`
	// Attempt is this replica's place in the order a request tries
	// (1: the pick, 2 and on: the retries, when the request may be
	// retried); 0 when it is not tried.
	Attempt int `json:"attempt,omitempty"`
	// Skipped says why this replica does not take the key, when it comes
	// before the picked one (or there is none).
	Skipped string `json:"skipped,omitempty"`
}

// MemberInfo is one gossip member with its metadata. A plain value.
type MemberInfo struct {
	// Node is the gossip node name; Gossip its gossip address.
	Node   string `json:"node"`
	Gossip string `json:"gossip"`
	// Role is "proxy" or "replica".
	Role string `json:"role"`
	// Status is the gossip status ("alive", "dead", "left").
	Status string    `json:"status"`
	Since  time.Time `json:"since"`
	Self   bool      `json:"self,omitempty"`
	// Set, Replica and State are a replica's; Addr is a replica's HTTP
	// address or a proxy's admin address.
	Set         string `json:"set,omitempty"`
	Replica     string `json:"replica,omitempty"`
	Addr        string `json:"addr,omitempty"`
	State       string `json:"state,omitempty"`
	Zone        string `json:"zone,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// Supervised says whether a replica's agent runs the replica's
	// process (started with -- CMD): only then can a rolling restart or a
	// repair restart it. Absent for proxies, and for agents too old to
	// say.
	Supervised *bool `json:"supervised,omitempty"`
	// Refused, when not empty, says why the member's claim (its role,
	// and a replica's name) is not believed: unsigned, bad_signature,
	// unknown_key, wrong_key (signed with a key of another role or set)
	// or claim_conflict (a second claim to a live replica name). Role is
	// then "unknown": nothing routes to it, counts it as a proxy or obeys
	// it.
	Refused string `json:"refused,omitempty"`
	// ID is a proxy's fleet ID (its node name if it advertises none); two
	// alive proxy members with one ID are the old and the new process of
	// one proxy, during a binary upgrade.
	ID string `json:"id,omitempty"`
}

// DrainResult is the 202 answer of drain and undrain.
type DrainResult struct {
	Set     string `json:"set"`
	Replica string `json:"replica"`
	// Action is "drain" or "undrain".
	Action string `json:"action"`
	// Scope is "gossip" or "this proxy".
	Scope string `json:"scope"`
}

// Scopes of a drain.
const (
	ScopeGossip    = "gossip"
	ScopeThisProxy = "this proxy"
)

// ReloadResult is the answer of a successful reload.
type ReloadResult struct {
	// Result is "success".
	Result string `json:"result"`
	// File is the configuration file read.
	File string `json:"file"`
	// Added, Removed and Changed name replica sets; RingChanged the
	// changed sets whose hash changed (their keys move).
	Added       []string `json:"added"`
	Removed     []string `json:"removed"`
	Changed     []string `json:"changed"`
	RingChanged []string `json:"ring_changed"`
	// Keys lists every key whose value changed, as YAML paths.
	Keys []string `json:"keys"`
	// Warnings are what the reload applied that is probably a mistake:
	// a removed set whose requests now go to another set.
	Warnings []string `json:"warnings,omitempty"`
}

// SetChange is the answer of a run-time change of a replica set: POST
// /v1/replica_sets (create), PATCH and DELETE /v1/replica_sets/{set}, and
// DELETE /v1/runtime/{set} (clear).
type SetChange struct {
	Set string `json:"set"`
	// Action is create, delete, stop, start, scale (several joined by
	// '+': "stop+scale") or clear.
	Action string `json:"action"`
	// Version is the version of the set's run-time state this change
	// wrote; every proxy applies the highest.
	Version uint64 `json:"version"`
	// By is who issued it (the X-Keyway-Actor header, else "anonymous",
	// and the client address); Via the proxy that took it (its fleet ID,
	// or "local" without gossip).
	By  string `json:"by"`
	Via string `json:"via"`
	// Scope is "fleet" (every proxy of the gossip cluster applies it) or
	// "this proxy" (gossip is off).
	Scope string `json:"scope"`
	// Replicas and Previous are the declared count after and before (PATCH
	// with replicas); Stopped whether the set is stopped after the change.
	Replicas *int  `json:"replicas,omitempty"`
	Previous *int  `json:"previous,omitempty"`
	Stopped  *bool `json:"stopped,omitempty"`
	// Created and Deleted list the Kubernetes objects keyway made for a
	// set created with a StatefulSet template, and deleted with it, as
	// "Kind namespace/name".
	Created []string `json:"created,omitempty"`
	Deleted []string `json:"deleted,omitempty"`
}

// ScopeFleet is the scope of a run-time change that every proxy applies.
const ScopeFleet = "fleet"

// SetRuntime says how a replica set's run-time state changes what the
// configuration file says about it. A plain value.
type SetRuntime struct {
	Version uint64    `json:"version"`
	Action  string    `json:"action"`
	By      string    `json:"by"`
	Via     string    `json:"via"`
	At      time.Time `json:"at"`
	// Overrides lists what differs from the file: "definition" (a set
	// created at run time), "stopped", "replicas".
	Overrides []string `json:"overrides"`
}

// RuntimeRecord is one set's run-time state as GET /v1/runtime shows it.
type RuntimeRecord struct {
	Set string `json:"set"`
	// Version orders the writes of the set's state: a hybrid logical
	// clock, the writer's Unix milliseconds << 16 | a counter (records
	// written by older keyway versions hold small Lamport versions, which
	// order below). It is above 2^53: read it as an integer, not a float.
	Version uint64    `json:"version"`
	Origin  string    `json:"origin"`
	Action  string    `json:"action"`
	By      string    `json:"by"`
	Via     string    `json:"via"`
	At      time.Time `json:"at"`
	Deleted bool      `json:"deleted,omitempty"`
	// Spec is the definition of a set created at run time.
	Spec     json.RawMessage `json:"spec,omitempty"`
	Stopped  *bool           `json:"stopped,omitempty"`
	Replicas *int            `json:"replicas,omitempty"`
}

// RuntimeProblem is a run-time record this proxy could not apply.
type RuntimeProblem struct {
	Set     string `json:"set"`
	Version uint64 `json:"version"`
	Problem string `json:"problem"`
}

// RuntimeStatus is the answer of GET /v1/runtime: the fleet's run-time
// state as this proxy holds it.
type RuntimeStatus struct {
	// Digest is equal on proxies that hold the same state.
	Digest string `json:"digest"`
	// Synced says this proxy has compared its state with another proxy's
	// since it started (or waited long enough without one).
	Synced bool `json:"synced"`
	// StateDir is where the state is kept on disk ("" in memory only).
	StateDir string           `json:"state_dir"`
	Records  []RuntimeRecord  `json:"records"`
	Problems []RuntimeProblem `json:"problems"`
}

// FleetStatus is the answer of GET /v1/fleet: whether the proxies of the
// fleet route every set alike, what the fleet holds out on shared
// evidence, and whether this proxy has lost gossip contact.
type FleetStatus struct {
	// Self is this proxy's fleet ID (fleet.id; "" when gossip is off), by
	// which the other proxies know it, and SelfNode its gossip node name
	// (one per process: two during a binary upgrade).
	Self     string `json:"self"`
	SelfNode string `json:"self_node,omitempty"`
	// Share says this proxy publishes its evidence and follows the fleet's
	// verdict (fleet.share).
	Share bool `json:"share"`
	// Isolated says this proxy has lost gossip contact with its peers: it
	// keeps its last view of the replicas and takes them out only on
	// data-path evidence. IsolatedSince is when that started.
	Isolated      bool      `json:"isolated"`
	IsolatedSince time.Time `json:"isolated_since,omitzero"`
	// Agree says every other proxy with a current view routes every set
	// this proxy serves like it does (true when there is no other proxy).
	Agree bool `json:"agree"`
	// Proxies are the other proxies this one has a current view of.
	Proxies []FleetProxy `json:"proxies"`
	// Sets compare this proxy's routing digest of each set with the
	// others'.
	Sets []FleetSet `json:"sets"`
}

// FleetProxy is another proxy of the fleet.
type FleetProxy struct {
	// ID is its fleet ID (its gossip node name if it advertises none: an
	// older version).
	ID string `json:"id"`
	// Node is the gossip node whose view this proxy follows (its newest
	// process), and Nodes every alive gossip node carrying the ID, sorted:
	// two while it upgrades its binary.
	Node  string   `json:"node"`
	Nodes []string `json:"nodes"`
	// Admin is its admin API address, as it advertises it.
	Admin string `json:"admin,omitempty"`
	// Heard is when its last view arrived (every fleet.interval).
	Heard time.Time `json:"heard"`
}

// FleetSet is one replica set across the fleet.
type FleetSet struct {
	Set string `json:"set"`
	// Digest identifies what decides the set's routing here: ring
	// parameters, ring members and rotation. Equal digests route every key
	// alike.
	Digest string `json:"digest"`
	// Agree says every peer serving the set has the same digest.
	Agree bool `json:"agree"`
	// Held are the replicas the fleet holds out on proxies' shared
	// evidence (fleet.share), with the proxies that vote against them
	// ("self" for this one).
	Held []FleetHeld `json:"held"`
	// Peers are the other proxies serving the set and their digests.
	Peers []FleetPeerDigest `json:"peers"`
	// Why and Fix explain a disagreement (absent while the set agrees):
	// its likely cause from what this proxy knows, and what to do.
	Why string `json:"why,omitempty"`
	Fix string `json:"fix,omitempty"`
}

// FleetHeld is a replica the fleet holds out.
type FleetHeld struct {
	Replica string    `json:"replica"`
	Voters  []string  `json:"voters"`
	Since   time.Time `json:"since"`
}

// FleetPeerDigest is one peer's digest of a set.
type FleetPeerDigest struct {
	// ID is the peer's fleet ID.
	ID     string `json:"id"`
	Digest string `json:"digest"`
	Agrees bool   `json:"agrees"`
	// DisagreeingSince and DisagreeingSeconds say how long the digests
	// have differed (absent while they agree).
	DisagreeingSince   time.Time `json:"disagreeing_since,omitzero"`
	DisagreeingSeconds float64   `json:"disagreeing_seconds,omitempty"`
}

// RepairResult is the 202 answer of POST /v1/replica_sets/{set}/repair.
type RepairResult struct {
	Set string `json:"set"`
	// Agents are the gossip nodes of the set's replicas that were told to
	// restart a replica that gave up; Failed are those of them that
	// advertised failed (the ones a repair restarts).
	Agents []string `json:"agents"`
	Failed []string `json:"failed"`
	// Proxies counts the other proxies told to lift their holds.
	Proxies int `json:"proxies"`
	// Reset lists the replicas this proxy lifted a health hold of.
	Reset []string `json:"reset"`
	// Pods lists the pods deleted (a set on a StatefulSet): in
	// CrashLoopBackOff or Failed, or of a failed replica whose agent
	// supervises no process. Their StatefulSet makes them again.
	Pods []string `json:"pods,omitempty"`
}

// ReplicaSetPlan is the answer of GET /v1/replica_sets/{set}/plan: what
// adding and removing ring members would do to the set's partitions (and
// so to its keys), computed from the set's current ring and hash config
// with the placement code the proxy routes with. Nothing changes. A plain
// value.
type ReplicaSetPlan struct {
	Set string `json:"set"`
	// Generation is the routing table the plan starts from.
	Generation uint64 `json:"generation"`
	// Fingerprint is the ring's shape, the same before and after.
	Fingerprint string `json:"fingerprint"`
	Partitions  int    `json:"partitions"`
	// Add and Remove are the change, sorted.
	Add    []string `json:"add"`
	Remove []string `json:"remove"`
	// MovedPartitions counts the partitions whose owner changes: the
	// moved_partitions of the ring_rebuild event the change will cause.
	// MovedShare is that count / Partitions (0..1): the share of keys that
	// move.
	MovedPartitions int     `json:"moved_partitions"`
	MovedShare      float64 `json:"moved_share"`
	// Now and After are the balance of the ring before and after.
	Now   PlanBalance `json:"now"`
	After PlanBalance `json:"after"`
	// Replicas has one row per replica of either ring, sorted by name.
	Replicas []PlanReplica `json:"replicas"`
	// Notes say what the plan does not cover (rotation, weights).
	Notes []string `json:"notes"`
}

// PlanBalance is how evenly one ring spreads its partitions. All zero for
// an empty ring.
type PlanBalance struct {
	// Members counts ring members.
	Members int `json:"members"`
	// MinPartitions and MaxPartitions are the fewest and most partitions a
	// member owns; MeanPartitions is partitions / members.
	MinPartitions  int     `json:"min_partitions"`
	MaxPartitions  int     `json:"max_partitions"`
	MeanPartitions float64 `json:"mean_partitions"`
	// MaxOverMean and MinOverMean are MaxPartitions and MinPartitions
	// divided by the mean (1 is perfectly even; the load bound caps the
	// first near the hash config's load).
	MaxOverMean float64 `json:"max_over_mean"`
	MinOverMean float64 `json:"min_over_mean"`
}

// PlanReplica is one replica in a plan.
type PlanReplica struct {
	Name string `json:"name"`
	// Change is "joins" (in add), "leaves" (in remove) or "stays".
	Change string `json:"change"`
	// PartitionsNow and PartitionsAfter are the partitions it owns before
	// and after (0 off that ring); ShareNow and ShareAfter the same
	// divided by the partition count.
	PartitionsNow   int     `json:"partitions_now"`
	PartitionsAfter int     `json:"partitions_after"`
	ShareNow        float64 `json:"share_now"`
	ShareAfter      float64 `json:"share_after"`
	// Gained counts the partitions it would take over, Lost those it would
	// hand over, and GainedShare and LostShare are their shares of all
	// partitions (= of all keys). A replica that stays may both gain and
	// lose some: the load bound moves a few between members that stay.
	Gained      int     `json:"gained"`
	Lost        int     `json:"lost"`
	GainedShare float64 `json:"gained_share"`
	LostShare   float64 `json:"lost_share"`
}

// Values of PlanReplica.Change.
const (
	PlanJoins  = "joins"
	PlanLeaves = "leaves"
	PlanStays  = "stays"
)

// RestartStatus is a rolling restart of a set (POST and GET
// /v1/replica_sets/{set}/restart): one replica at a time, drained on every
// proxy, its process restarted by its agent, undrained once it is back.
type RestartStatus struct {
	Set string `json:"set"`
	// State is "running", "done", "failed" (a step timed out or failed;
	// Error says which) or "interrupted" (the proxy running it stopped
	// with no other proxy to take it over).
	State string `json:"state"`
	// Owner is the fleet ID of the proxy running it. Every proxy shows
	// the same restart; if the owner leaves the fleet (no alive process
	// carries its ID), the alive proxy with the lowest ID takes it over (a
	// "takeover" step). A binary upgrade of the owner hands nothing over:
	// its new process resumes the restart once the old one is gone (a
	// "resumed" step).
	Owner string `json:"owner"`
	// OwnerNode is the gossip node of the owner's process that runs it:
	// the new process, once it has resumed the restart after an upgrade.
	OwnerNode string `json:"owner_node,omitempty"`
	// By is who started it.
	By string `json:"by,omitempty"`
	// Replicas are the replicas it restarts, in order; Current the one
	// being restarted ("" when not running).
	Replicas []string `json:"replicas"`
	Current  string   `json:"current,omitempty"`
	// StepTimeout bounds each step (drained, process started, back in
	// rotation).
	StepTimeout string `json:"step_timeout"`
	// Force restarts each replica's process as soon as it is out of
	// rotation on the proxy running the restart, without waiting for its
	// requests in flight to finish ("force": true in the POST body): for
	// replicas that hang in their drain. Their requests in flight fail.
	Force    bool          `json:"force,omitempty"`
	Started  time.Time     `json:"started"`
	Finished time.Time     `json:"finished,omitzero"`
	Steps    []RestartStep `json:"steps"`
	Error    string        `json:"error,omitempty"`
	// Acknowledged and AcknowledgedBy say when and by whom an operator
	// acknowledged a failed or interrupted restart (POST
	// /v1/replica_sets/{set}/restart/ack): its mark is no longer shown.
	// Zero until then; a new restart starts without.
	Acknowledged   time.Time `json:"acknowledged,omitzero"`
	AcknowledgedBy string    `json:"acknowledged_by,omitempty"`
	// Mark says the dashboard shows this restart as failed: it failed or
	// was interrupted, and neither has the set been Running since then
	// (on the proxy answering) nor has an operator acknowledged it.
	// Cleared says why a failed restart is no longer marked: "running"
	// (the set's phase turned Running after the failure, at
	// RunningSince) or "acknowledged". Both are worked out by the proxy
	// answering the GET; the fleet's record does not hold them.
	Mark         bool      `json:"mark,omitempty"`
	Cleared      string    `json:"cleared,omitempty"`
	RunningSince time.Time `json:"running_since,omitzero"`
}

// Values of RestartStatus.Cleared.
const (
	ClearedRunning      = "running"
	ClearedAcknowledged = "acknowledged"
)

// RestartRequest is the optional JSON body of POST
// /v1/replica_sets/{set}/restart; no body means every field's zero.
type RestartRequest struct {
	// Force: see RestartStatus.Force. Also ?force=true.
	Force bool `json:"force,omitempty"`
}

// RestartOptions are a rolling restart's parameters.
type RestartOptions struct {
	// StepTimeout bounds each step; the API's default is 2m.
	StepTimeout time.Duration
	// Force: see RestartStatus.Force.
	Force bool
}

// RefusedBody is the 409 answer of a restart or repair refused at once
// because it cannot do what it is asked: ErrorBody's error, and its parts.
type RefusedBody struct {
	Error string `json:"error"`
	Set   string `json:"set"`
	// Replicas are the replicas the refusal is about (may be empty: none
	// is failed).
	Replicas []string `json:"replicas"`
	Reason   string   `json:"reason"`
	Fix      string   `json:"fix"`
}

// RestartStep is one step of a rolling restart.
type RestartStep struct {
	Time    time.Time `json:"time"`
	Replica string    `json:"replica"`
	// Step is "drain", "drained", "restart", "started", "undrain",
	// "ready", "failed", "handover" (the owner's process is stopping and
	// leaves it to another proxy, or to its own new process), "takeover"
	// (another proxy continues it) or "resumed" (the owner's new process
	// continues it).
	Step   string `json:"step"`
	Detail string `json:"detail,omitempty"`
}
