package eventlog

import (
	"bufio"
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"keyway/internal/jsonstr"
)

// Event kinds: the catalogue of docs/audit.md. Producers that may not
// import this package (design.md's import direction) use the same strings.
// Kind is a metric label (keyway_audit_events_total{kind}), so it must come
// from a small fixed set, never from request data.
const (
	KindMemberJoin     = "member_join"     // a member appeared in gossip, or came back alive
	KindMemberLeave    = "member_leave"    // a member left gossip on purpose
	KindMemberDead     = "member_dead"     // gossip declared a member dead (crash, partition)
	KindStateChange    = "state_change"    // a replica's advertised lifecycle state changed
	KindProbeDown      = "probe_down"      // active checks marked a replica down
	KindProbeUp        = "probe_up"        // active checks marked it up again
	KindEjected        = "ejected"         // passive checks ejected a replica
	KindReadmitted     = "readmitted"      // an ejection ended
	KindFailed         = "failed"          // supervision holds a replica out as failed
	KindRecovered      = "recovered"       // a failed hold ended
	KindRingRebuild    = "ring_rebuild"    // a set's ring changed (partitions moved)
	KindRotationChange = "rotation_change" // the replicas in rotation changed, the ring did not
	KindPhaseChange    = "phase_change"    // a replica set's phase changed
	KindAdminAction    = "admin_action"    // a mutating admin API call
	KindConfigReload   = "config_reload"   // a configuration reload, applied or refused
	KindRuntimeChange  = "runtime_change"  // a run-time change of a replica set (create, delete, stop, start, scale, clear), from this proxy or another
	KindTLSReload      = "tls_reload"      // a listener's TLS certificates reloaded (configuration reload or file change), or the new files refused
	// A supervising agent's report about its replica's process: started,
	// exited, restart scheduled, given up, repaired (field "event").
	KindReplicaProcess = "replica_process"
	// The local runner (a set's run section) started, adopted, stopped or
	// restarted a replica's agent (field "event").
	KindReplicaJob = "replica_job"
	// The fleet (proxy.FleetEvent).
	KindGossipRefused     = "gossip_refused"     // a member's message or claim not authenticated for its role was refused (once per sender, reason and minute)
	KindStatefulSet       = "statefulset"        // the Kubernetes backend acted on a set's StatefulSet: a scale-in asked for and carried out, a pod deleted to revive, restart or repair its replica
	KindFleetHold         = "fleet_hold"         // the fleet holds a replica out on another proxy's evidence
	KindFleetRelease      = "fleet_release"      // the fleet lets it back
	KindFleetDisagreement = "fleet_disagreement" // another proxy has routed a set differently for longer than fleet.disagreement_bound
	KindFleetAgreement    = "fleet_agreement"    // it routes the set like this proxy again
)

// Event is one entry of the audit trail: one JSON object per line of a
// file (see [Event.MarshalJSON]). An Event is a plain value and may be
// copied; copies share Fields.
type Event struct {
	// Time is when it happened ("ts"). [Log.Emit] sets it to the log's
	// clock when zero, and converts it to UTC.
	Time time.Time
	// Node is the node that wrote it ("node"). [Log.Emit] sets it to the
	// log's node name, whatever the caller put there.
	Node string
	// Kind says what happened ("kind"), one of the Kind constants.
	Kind string
	// Set is the replica set concerned ("set"); omitted when empty.
	Set string
	// Replica is the replica concerned ("replica"); omitted when empty.
	Replica string
	// Fields carries the kind's details, flattened into the same JSON
	// object in key order. Keys equal to ts, node, kind, set or replica
	// are never written. nil means none. See [Event.MarshalJSON] for how
	// values are written.
	Fields map[string]any
}

// tsLayout is RFC 3339 with exactly nine fraction digits, so that the
// timestamps of a file sort (and compare in jq) as strings.
const tsLayout = "2006-01-02T15:04:05.000000000Z07:00"

// reserved reports whether key is one of the fixed keys of a line.
func reserved(key string) bool {
	switch key {
	case "ts", "node", "kind", "set", "replica":
		return true
	}
	return false
}

// MarshalJSON returns the event as it is written to a file, without the
// newline: ts, node, kind, then set and replica when not empty, then the
// fields sorted by key. ts is RFC 3339 in UTC with nine fraction digits.
//
// Field values: strings, booleans, integers and finite floats as JSON
// scalars; time.Duration as its String ("1.5s"); time.Time like ts; error
// as its Error(); a value implementing json.Marshaler or
// encoding.TextMarshaler as encoding/json writes it; another fmt.Stringer
// as its String(); anything else as encoding/json writes it. A value that
// cannot be written (NaN, a channel, a method that panics) is written as
// a string describing it, so MarshalJSON never fails.
//
// Strings are escaped by internal/jsonstr, as in the access log: invalid
// UTF-8 becomes U+FFFD, and control characters, DEL, U+2028 and U+2029
// are escaped, so that a line never spans lines.
func (e Event) MarshalJSON() ([]byte, error) {
	b, _ := appendEvent(make([]byte, 0, 256), &e, nil)
	return b, nil
}

// appendEvent appends e's line (without newline) to dst. keys is scratch
// space for sorting the field keys, returned for reuse.
func appendEvent(dst []byte, e *Event, keys []string) ([]byte, []string) {
	dst = append(dst, `{"ts":"`...)
	dst = e.Time.UTC().AppendFormat(dst, tsLayout)
	dst = append(dst, `","node":`...)
	dst = jsonstr.Append(dst, e.Node)
	dst = append(dst, `,"kind":`...)
	dst = jsonstr.Append(dst, e.Kind)
	if e.Set != "" {
		dst = append(dst, `,"set":`...)
		dst = jsonstr.Append(dst, e.Set)
	}
	if e.Replica != "" {
		dst = append(dst, `,"replica":`...)
		dst = jsonstr.Append(dst, e.Replica)
	}
	if len(e.Fields) > 0 {
		keys = keys[:0]
		for k := range e.Fields {
			if !reserved(k) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			dst = append(dst, ',')
			dst = jsonstr.Append(dst, k)
			dst = append(dst, ':')
			dst = appendValue(dst, e.Fields[k])
		}
	}
	return append(dst, '}'), keys
}

// appendValue appends v as JSON. A panic in a method of v (a nil pointer
// receiver, say) is written as a string instead of crashing the writer.
func appendValue(dst []byte, v any) (out []byte) {
	defer func() {
		if r := recover(); r != nil {
			out = jsonstr.Append(dst, fmt.Sprintf("!panic: %v", r))
		}
	}()
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...)
	case string:
		return jsonstr.Append(dst, v)
	case bool:
		return strconv.AppendBool(dst, v)
	case int:
		return strconv.AppendInt(dst, int64(v), 10)
	case int8:
		return strconv.AppendInt(dst, int64(v), 10)
	case int16:
		return strconv.AppendInt(dst, int64(v), 10)
	case int32:
		return strconv.AppendInt(dst, int64(v), 10)
	case int64:
		return strconv.AppendInt(dst, v, 10)
	case uint:
		return strconv.AppendUint(dst, uint64(v), 10)
	case uint8:
		return strconv.AppendUint(dst, uint64(v), 10)
	case uint16:
		return strconv.AppendUint(dst, uint64(v), 10)
	case uint32:
		return strconv.AppendUint(dst, uint64(v), 10)
	case uint64:
		return strconv.AppendUint(dst, v, 10)
	case float32:
		return appendFloat(dst, float64(v), 32)
	case float64:
		return appendFloat(dst, v, 64)
	case time.Duration:
		return jsonstr.Append(dst, v.String())
	case time.Time:
		dst = append(dst, '"')
		dst = v.UTC().AppendFormat(dst, tsLayout)
		return append(dst, '"')
	case json.Marshaler, encoding.TextMarshaler:
		return appendMarshal(dst, v)
	case error:
		return jsonstr.Append(dst, v.Error())
	case fmt.Stringer:
		return jsonstr.Append(dst, v.String())
	}
	return appendMarshal(dst, v)
}

// appendMarshal appends encoding/json's encoding of v, or, when it fails,
// v formatted with %v as a string.
func appendMarshal(dst []byte, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return jsonstr.Append(dst, fmt.Sprintf("%v", v))
	}
	return append(dst, b...)
}

// appendFloat writes f the way encoding/json does; NaN and infinities,
// which JSON cannot carry, become the strings "NaN", "+Inf" and "-Inf".
func appendFloat(dst []byte, f float64, bits int) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return jsonstr.Append(dst, strconv.FormatFloat(f, 'g', -1, bits))
	}
	abs, format := math.Abs(f), byte('f')
	if abs != 0 && (bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21)) {
		format = 'e'
	}
	return strconv.AppendFloat(dst, f, format, -1, bits)
}

// UnmarshalJSON reads one line back. ts is required; node, kind, set and
// replica must be strings when present; every other key goes to Fields
// (nil when there is none). Numbers in Fields come back as int64 when they
// are integers that fit, as float64 otherwise; objects as map[string]any,
// arrays as []any. JSON null leaves e unchanged.
func (e *Event) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return fmt.Errorf("eventlog: %w", err)
	}
	if m == nil {
		return nil
	}
	var ev Event
	ts, ok := m["ts"].(string)
	if !ok {
		return errors.New(`eventlog: "ts" is missing or not a string`)
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return fmt.Errorf("eventlog: ts: %w", err)
	}
	ev.Time = t.UTC()
	for key, dst := range map[string]*string{"node": &ev.Node, "kind": &ev.Kind, "set": &ev.Set, "replica": &ev.Replica} {
		v, present := m[key]
		if !present {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("eventlog: %q is not a string", key)
		}
		*dst = s
	}
	for k, v := range m {
		if reserved(k) {
			continue
		}
		if ev.Fields == nil {
			ev.Fields = make(map[string]any, len(m))
		}
		ev.Fields[k] = normalize(v)
	}
	*e = ev
	return nil
}

// normalize turns json.Number into int64 or float64, at any depth.
func normalize(v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case map[string]any:
		for k, x := range v {
			v[k] = normalize(x)
		}
	case []any:
		for i, x := range v {
			v[i] = normalize(x)
		}
	}
	return v
}

// ReadFile reads a file of the audit trail (or any file of JSON lines in
// its format) and returns its events in file order. Empty lines are
// skipped. At the first line that is not an event it stops and returns the
// events before it with an error naming the file and line; a last line cut
// short by a crash is reported this way.
func ReadFile(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readEvents(f, path)
}

func readEvents(r io.Reader, name string) ([]Event, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var out []Event
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var e Event
			if uerr := json.Unmarshal(line, &e); uerr != nil {
				return out, fmt.Errorf("%s:%d: %w", name, n, uerr)
			}
			out = append(out, e)
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("%s:%d: %w", name, n, err)
		}
	}
}

// ReadDir reads every file of one node's directory (DIR/NODE, see
// [NodeDir]) in sequence order and returns their events, oldest first.
// Other files in the directory are ignored. On an error it returns the
// events read so far with the error.
func ReadDir(nodeDir string) ([]Event, error) {
	seqs, err := listSeqs(nodeDir)
	if err != nil {
		return nil, err
	}
	var out []Event
	for _, s := range seqs {
		evs, err := ReadFile(seqPath(nodeDir, s))
		out = append(out, evs...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}
