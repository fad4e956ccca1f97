package runstate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"go.uber.org/zap"

	"keyway/membership"
)

// The wire forms: a digest every interval, the records on a difference.
// Node is the sender's gossip node name as it declares it: proxies of
// older versions reply to it, so it is still written; this version
// replies to the authenticated sender (membership.Message.From) instead.
const (
	runtimeDigestKind  = "runtime_digest"
	runtimeRecordsKind = "runtime_records"
)

type runtimeDigest struct {
	Kind   string `json:"kind"`
	Node   string `json:"node"`
	Digest string `json:"digest"`
}

type runtimeRecords struct {
	Kind   string `json:"kind"`
	Node   string `json:"node"`
	Digest string `json:"digest"` // the sender's, over all its records
	Reply  bool   `json:"reply,omitempty"`
	// Ack asks for an acknowledgement (runtime_ack) of the records: a
	// write waits for it (confirm.go). Older versions ignore it.
	Ack     bool     `json:"ack,omitempty"`
	Records []Record `json:"records"`
}

// Synced reports whether this proxy has compared its state with another
// proxy's (and taken theirs), or waited 3 intervals without hearing one:
// until then a proxy that just started may not know the fleet's changes.
func (r *State) Synced() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced || (!r.started.IsZero() && r.now().Sub(r.started) >= 3*r.interval)
}

// Digest returns a digest of every record's key (its wire form), version,
// origin and time: two proxies with equal digests hold the same state,
// whichever of the two versions of keyway they run.
func (r *State) Digest() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.digestLocked()
}

func (r *State) digestLocked() string {
	if len(r.recs) == 0 {
		return ""
	}
	h := sha256.New()
	for _, rec := range r.sortedLocked() {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00%d\x00", rec.Key().wire(), rec.Version, rec.Origin, rec.At.UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// handle takes a message as the node's decoder would hand it over (for
// tests: Attach registers the handlers with the node).
func (r *State) handle(from string, msg []byte) {
	switch membership.MessageKind(msg) {
	case runtimeDigestKind:
		r.handleDigest(membership.Message{From: from, Kind: runtimeDigestKind, Body: msg})
	case runtimeRecordsKind:
		r.handleRecords(membership.Message{From: from, Kind: runtimeRecordsKind, Body: msg})
	case runtimeAckKind:
		r.handleAck(membership.Message{From: from, Kind: runtimeAckKind, Body: msg})
	}
}

// handleDigest compares another proxy's digest with this one's.
func (r *State) handleDigest(m membership.Message) {
	var d runtimeDigest
	if json.Unmarshal(m.Body, &d) != nil || m.From == "" {
		return
	}
	r.mu.Lock()
	mine := r.digestLocked()
	if mine == d.Digest {
		r.synced = true
	}
	r.mu.Unlock()
	if mine != d.Digest {
		r.sendAll(m.From, true)
	}
}

// handleRecords merges another proxy's records.
func (r *State) handleRecords(m membership.Message) {
	var rr runtimeRecords
	if json.Unmarshal(m.Body, &rr) != nil || m.From == "" {
		return
	}
	r.merge(m.From, rr.Records)
	if rr.Ack {
		r.sendAcks(m.From, rr.Records)
	}
	if rr.Reply && r.Digest() != rr.Digest {
		// The sender lacks something of ours (or holds older records).
		r.sendAll(m.From, false)
	}
}

// Run sends the digest to every other alive proxy every interval until
// ctx is done.
func (r *State) Run(ctx context.Context) error {
	r.mu.Lock()
	r.started = r.now()
	r.mu.Unlock()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	defer r.sends.Wait()
	r.sendDigests()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.sendDigests()
		}
	}
}

func (r *State) sendDigests() {
	r.mu.Lock()
	send, self := r.sendFn, r.selfName()
	d := r.digestLocked()
	targets := r.aliveProxiesLocked()
	r.mu.Unlock()
	if send == nil {
		return
	}
	msg, _ := json.Marshal(runtimeDigest{Kind: runtimeDigestKind, Node: self, Digest: d})
	for _, name := range targets {
		if err := send(name, msg, false); err != nil {
			r.log.Debug("run-time digest not sent", zap.String("proxy", name), zap.Error(err))
		}
	}
}

func (r *State) aliveProxiesLocked() []string {
	if r.proxies == nil {
		return nil
	}
	return r.proxies()
}

// push sends new records to every other alive proxy now, asking for
// acknowledgements when ack is set.
func (r *State) push(recs []Record, ack bool) {
	r.mu.Lock()
	targets := r.aliveProxiesLocked()
	r.mu.Unlock()
	for _, name := range targets {
		r.sendRecords(name, recs, false, ack)
	}
}

// sendAll sends every record to one proxy.
func (r *State) sendAll(to string, reply bool) {
	r.mu.Lock()
	all := r.sortedLocked()
	r.mu.Unlock()
	r.send(to, all, reply)
}

func (r *State) send(to string, recs []Record, reply bool) { r.sendRecords(to, recs, reply, false) }

func (r *State) sendRecords(to string, recs []Record, reply, ack bool) {
	r.mu.Lock()
	send, self := r.sendFn, r.selfName()
	d := r.digestLocked()
	r.mu.Unlock()
	if send == nil {
		return
	}
	msg, err := json.Marshal(runtimeRecords{Kind: runtimeRecordsKind, Node: self, Digest: d, Reply: reply, Ack: ack, Records: recs})
	if err != nil {
		r.log.Error("run-time records not encoded", zap.Error(err))
		return
	}
	if len(msg) <= membership.MaxPacket {
		if err := send(to, msg, false); err != nil {
			r.log.Debug("run-time records not sent", zap.String("proxy", to), zap.Error(err))
		}
		return
	}
	r.mu.Lock()
	if r.busy[to] {
		r.mu.Unlock()
		return // one is on its way; the next digest repairs what it lacks
	}
	r.busy[to] = true
	r.mu.Unlock()
	r.sends.Go(func() {
		if err := send(to, msg, true); err != nil {
			r.log.Debug("run-time records not sent", zap.String("proxy", to), zap.Error(err))
		}
		r.mu.Lock()
		delete(r.busy, to)
		r.mu.Unlock()
	})
}
