package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"keyway/balancer"
	"keyway/config"
	"keyway/eventlog"
	"keyway/eventlog/objstore"
	"keyway/fleetauth"
	"keyway/health"
	"keyway/membership"
	"keyway/proxy"
	"keyway/tlsconfig"
)

// This file connects the components' callbacks: the audit trail is fed
// from the proxy's tables, gossip, health and phase changes, and the
// health checker learns its targets from the tables and acts through the
// proxy. Each adapter only converts; the logic lives in the components.

// auditNode names this process in the audit trail: stable across restarts
// (host and proxy port), unlike the gossip node name.
func auditNode(cfg config.Config) string {
	host, _ := os.Hostname()
	if host == "" {
		host = "keyway"
	}
	_, port, _ := net.SplitHostPort(cfg.Listen)
	if port == "" || port == "0" {
		port = "pid" + strconv.Itoa(os.Getpid())
	}
	return host + "-" + port
}

// lateSink is the health.Sink: the checker must exist before the proxy
// (the proxy observes through it), and acts on the proxy once it exists.
type lateSink struct{ p atomic.Pointer[proxy.Proxy] }

func (s *lateSink) SetExcluded(set, replica string, reason balancer.Reason, excluded bool) {
	if p := s.p.Load(); p != nil {
		p.SetExcluded(set, replica, reason, excluded)
	}
}

// healthTargets tells the checker each set's ring members.
type healthTargets struct{ hc *health.Checker }

func (h healthTargets) TableChanged(set string, _ int, ms []balancer.Member, _ balancer.RebuildInfo) {
	ts := make([]health.Target, 0, len(ms))
	for _, m := range ms {
		if m.Slot >= 0 {
			ts = append(ts, health.Target{Set: set, Replica: m.Name, Addr: m.Addr})
		}
	}
	h.hc.SetTargets(set, ts)
}

// SetRemoved stops checking a set that left the configuration.
func (h healthTargets) SetRemoved(set string) { h.hc.RemoveSet(set) }

// phaseObserver feeds the phase tracker and forgets removed sets.
type phaseObserver struct{ *health.PhaseTracker }

func (p phaseObserver) SetRemoved(set string) { p.RemoveSet(set) }

// tableAudit records ring rebuilds and rotation changes.
type tableAudit struct{ l *eventlog.Log }

// TableChanged records a ring rebuild or a rotation change with what
// places every key at that moment: the ring's fingerprint (its shape),
// its members (sorted, as the ring is built from them) and those in
// rotation, so that a reader of the trail can work out any partition's
// owner and pick with the balancer's own code (keyway audit).
func (a tableAudit) TableChanged(set string, _ int, ms []balancer.Member, info balancer.RebuildInfo) {
	kind := eventlog.KindRotationChange
	members, rotation := []string{}, []string{}
	for _, m := range ms {
		if m.Slot >= 0 {
			members = append(members, m.Name)
			if m.InRotation {
				rotation = append(rotation, m.Name)
			}
		}
	}
	fields := map[string]any{
		"generation": info.Generation, "cause": info.Cause, "ring_size": info.RingSize,
		"in_rotation": info.InRotation, "diverted_partitions": info.Diverted,
		"fingerprint": info.Fingerprint, "members": members, "rotation": rotation,
		"failover": info.Failover.String(),
	}
	if info.RingBuilt {
		kind = eventlog.KindRingRebuild
		fields["moved_partitions"] = info.Moved
		if len(info.Joined) > 0 {
			fields["joined"] = info.Joined
		}
		if len(info.Left) > 0 {
			fields["left"] = info.Left
		}
	}
	a.l.Record(kind, set, "", fields)
}

func auditMember(l *eventlog.Log) func(membership.MemberEvent) {
	return func(e membership.MemberEvent) {
		m := e.Member
		fields := map[string]any{"member": m.Node, "role": m.Meta.Role.String(), "status": m.Status.String(), "state": m.Meta.State.String(), "addr": m.Meta.Addr}
		if m.Meta.Role == membership.RoleProxy {
			fields["id"] = m.ID()
		}
		if e.From != "" {
			fields["from"] = e.From
		}
		l.Record(e.Kind, m.Meta.Set, m.Meta.Replica, fields)
	}
}

// auditRefused records refused gossip messages and claims (membership
// rate-limits them: once per sender, reason and minute).
func auditRefused(l *eventlog.Log) func(membership.Rejection) {
	return func(r membership.Rejection) {
		fields := map[string]any{"member": r.Node, "what": r.What, "reason": r.Reason, "detail": r.Detail, "count": r.Count}
		if r.Addr != "" {
			fields["addr"] = r.Addr
		}
		l.Record(eventlog.KindGossipRefused, "", "", fields)
	}
}

func auditHealth(l *eventlog.Log) func(health.Event) {
	return func(e health.Event) {
		fields := map[string]any{}
		if e.Reason != "" {
			fields["reason"] = e.Reason
		}
		if e.Ejections > 0 {
			fields["ejections"] = e.Ejections
		}
		if !e.Until.IsZero() {
			fields["until"] = e.Until
		}
		l.Emit(eventlog.Event{Time: e.Time, Kind: e.Kind, Set: e.Set, Replica: e.Replica, Fields: fields})
	}
}

func auditPhase(l *eventlog.Log, log *zap.Logger) func(health.PhaseChange) {
	return func(c health.PhaseChange) {
		log.Info("replica set phase changed", zap.String("set", c.Set), zap.String("from", string(c.From)), zap.String("to", string(c.To)),
			zap.Int("declared", c.Declared), zap.Int("members", c.Members), zap.Int("in_rotation", c.InRotation))
		l.Record(eventlog.KindPhaseChange, c.Set, "", map[string]any{
			"from": string(c.From), "to": string(c.To), "declared": c.Declared, "members": c.Members, "in_rotation": c.InRotation,
		})
	}
}

// auditFleet records the fleet's holds and releases and the disagreements
// that outlast fleet.disagreement_bound.
func auditFleet(l *eventlog.Log) func(proxy.FleetEvent) {
	return func(e proxy.FleetEvent) {
		fields := map[string]any{}
		if len(e.Voters) > 0 {
			fields["voters"] = e.Voters
		}
		if e.Peer != "" {
			fields["peer"] = e.Peer
		}
		if e.Digest != "" {
			fields["digest"], fields["peer_digest"] = e.Digest, e.PeerDigest
		}
		if e.For > 0 {
			fields["for_seconds"] = e.For.Seconds()
		}
		l.Record(e.Kind, e.Set, e.Replica, fields)
	}
}

// processAudit records the reports of supervising agents about their
// replica's process (membership.ProcessEvent: start, exit, restart,
// give_up, repair), one replica_process event each. It accepts a report
// only from an alive member with role replica whose metadata names the
// same set, replica and boot; others are dropped (logged at debug). It
// runs on the gossip message worker and only records.
type processAudit struct {
	l       *eventlog.Log
	members func() []membership.Member
	log     *zap.Logger
}

func (p processAudit) HandleMessage(from string, msg []byte) {
	if membership.MessageKind(msg) == membership.ProcessEventKind {
		p.handle(membership.Message{From: from, Body: msg})
	}
}

// handle takes one report. A signed one must be signed with the key of
// the set it is about.
func (p processAudit) handle(m membership.Message) {
	from, msg := m.From, m.Body
	e, err := membership.DecodeProcessEvent(msg)
	if err != nil {
		p.log.Debug("malformed replica process event dropped", zap.String("from", from), zap.Error(err))
		return
	}
	if m.Signer.Role != fleetauth.RoleNone && m.Signer.Set != e.Set {
		p.log.Warn("replica process event about another set than its signer's dropped", zap.String("from", from),
			zap.String("set", e.Set), zap.String("signer", m.Signer.String()))
		return
	}
	if !processSender(p.members(), from, e) {
		p.log.Debug("replica process event from a member that is not its agent dropped", zap.String("from", from),
			zap.String("set", e.Set), zap.String("replica", e.Replica))
		return
	}
	p.l.Record(eventlog.KindReplicaProcess, e.Set, e.Replica, processFields(from, e))
}

// processSender reports whether from is the alive agent of the replica
// incarnation e is about.
func processSender(ms []membership.Member, from string, e membership.ProcessEvent) bool {
	for _, m := range ms {
		if m.Node == from {
			return m.Status == membership.StatusAlive && m.Meta.Role == membership.RoleReplica &&
				m.Meta.Set == e.Set && m.Meta.Replica == e.Replica && m.Meta.Boot == e.Boot
		}
	}
	return false
}

// processFields are a replica_process event's details (docs/audit.md).
func processFields(from string, e membership.ProcessEvent) map[string]any {
	f := map[string]any{"event": e.Event, "member": from, "seq": e.Seq}
	if e.Pid != 0 {
		f["pid"] = e.Pid
	}
	switch e.Event {
	case "exit":
		f["reason"], f["restarts"] = e.Reason, e.Restarts
		switch {
		case e.Signal != "":
			f["signal"] = e.Signal
		case e.Reason != "start_error":
			f["code"] = e.Code
		}
		if e.Error != "" {
			f["error"] = e.Error
		}
	case "restart":
		f["restarts"], f["backoff"] = e.Restarts, time.Duration(e.BackoffMS)*time.Millisecond
	case "give_up":
		f["restarts"] = e.Restarts
	}
	return f
}

// auditTLS records a listener's TLS reloads (applied or refused).
func auditTLS(l *eventlog.Log) func(tlsconfig.Event) {
	return func(e tlsconfig.Event) {
		certs := make([]map[string]any, len(e.Certificates))
		for i, c := range e.Certificates {
			certs[i] = map[string]any{"cert_file": c.CertFile, "names": c.Names, "not_after": c.NotAfter.UTC().Format(time.RFC3339), "sha256": c.SHA256}
		}
		fields := map[string]any{"listener": e.Listener, "result": e.Result, "source": e.Source, "certificates": certs}
		if e.Result != "success" {
			fields["key"], fields["file"], fields["error"] = e.Key, e.File, e.Error
		}
		l.Record(eventlog.KindTLSReload, "", "", fields)
	}
}

// newAuditSink makes the object-storage sink of audit.sink: this process's
// run, named by its start time and node, on the bucket through the
// standard AWS configuration. A configuration the SDK cannot load is
// logged and leaves the sink off (nil): the audit trail is best effort,
// and never keeps the proxy from serving. Credentials are looked up at
// the first upload; a missing one is logged there, once per outage. With
// audit.dir, the spool is in DIR/NODE/spool, so that the segments not
// uploaded survive a restart; a directory that cannot be created is
// logged and the spool is in memory.
func newAuditSink(cfg config.Config, log *zap.Logger, reg prometheus.Registerer) (*objstore.Sink, error) {
	bucket, prefix, err := objstore.ParseURL(cfg.Audit.Sink)
	if err != nil {
		return nil, fmt.Errorf("audit.sink: %w", err)
	}
	store, err := objstore.NewS3(context.Background(), bucket, cfg.Audit.PathStyle)
	if err != nil {
		log.Warn("audit sink off: the object storage configuration did not load", zap.Error(err))
		return nil, nil
	}
	node := auditNode(cfg)
	sc := objstore.DefaultSinkConfig()
	sc.Prefix, sc.Run = prefix, objstore.RunID(time.Now(), node)
	sc.SegmentBytes, sc.SegmentAge, sc.SpoolBytes = int(cfg.Audit.SegmentBytes), cfg.Audit.SegmentAge, int(cfg.Audit.SpoolBytes)
	if cfg.Audit.Dir != "" {
		dir := filepath.Join(eventlog.NodeDir(cfg.Audit.Dir, node), "spool")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			log.Warn("audit sink: the spool directory cannot be created; spooling in memory", zap.String("dir", dir), zap.Error(err))
		} else {
			sc.SpoolDir = dir
		}
	}
	sink := objstore.NewSink(sc, store, log)
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "keyway", Subsystem: "audit_sink", Name: "dropped_events_total",
			Help: "Audit events the object-storage sink dropped: its queue or its spool (audit.spool_bytes) was full."},
			func() float64 { return float64(sink.Dropped()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "keyway", Subsystem: "audit_sink", Name: "segments_uploaded_total",
			Help: "Segments of audit events the object-storage sink uploaded."},
			func() float64 { return float64(sink.Uploaded()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "keyway", Subsystem: "audit_sink", Name: "spooled_bytes",
			Help: "Bytes of audit segments waiting for the object store (it is slow or unreachable)."},
			func() float64 { return float64(sink.Spooled()) }),
	)
	log.Info("audit events also go to object storage", zap.String("bucket", bucket), zap.String("prefix", prefix), zap.String("run", sc.Run),
		zap.String("spool_dir", sc.SpoolDir))
	return sink, nil
}
