package runstate

import (
	"encoding/json"
	"strings"
	"time"
)

// Kind is what a record holds: a replica set's state or the progress of
// its rolling restart.
type Kind uint8

const (
	// KindSet is a replica set's run-time state.
	KindSet Kind = iota
	// KindRestart is the progress of a set's rolling restart.
	KindRestart
)

func (k Kind) String() string {
	if k == KindRestart {
		return "restart"
	}
	return "set"
}

// restartPrefix prefixes the wire key of a restart record: proxies of
// older versions key records by one string, "orders" for the set and
// "restart:orders" for its rolling restart (':' is never part of a set
// name). The wire form and the state file keep that key; in Go a record
// has a Kind and the set's name.
const restartPrefix = "restart:"

// Key names one record: its kind and its set.
type Key struct {
	Kind Kind
	Set  string
}

// wire returns the key as records on the wire and in the state file
// carry it.
func (k Key) wire() string {
	if k.Kind == KindRestart {
		return restartPrefix + k.Set
	}
	return k.Set
}

// parseKey reads a wire key. Anything but the restart prefix is a set's
// name, as older versions read it.
func parseKey(s string) Key {
	if set, ok := strings.CutPrefix(s, restartPrefix); ok {
		return Key{Kind: KindRestart, Set: set}
	}
	return Key{Kind: KindSet, Set: s}
}

func (k Key) String() string { return k.wire() }

// Record is one record of the run-time state: a replica set's (KindSet)
// or its rolling restart's (KindRestart). Fields left empty let the
// configuration file decide; a set record with none set (Clear) hands the
// set back to the file.
//
// Its JSON form, on the wire and in the state file, is the one older
// versions read and write: the kind is not a field, a restart record's
// "set" is "restart:" + the set's name (MarshalJSON, UnmarshalJSON).
type Record struct {
	// Kind and Set are the record's key.
	Kind Kind   `json:"-"`
	Set  string `json:"set"`
	// Version orders writes (a hybrid logical clock: see MaxAhead); Origin,
	// the fleet ID of the proxy that wrote it, breaks ties (see Newer).
	Version uint64 `json:"version"`
	Origin  string `json:"origin"`
	// Spec is the definition of a set created at run time: a JSON object
	// with the fields of one replica_sets entry of the configuration file.
	// Empty: the file defines the set.
	Spec json.RawMessage `json:"spec,omitempty"`
	// Deleted hides the set, whatever the file says.
	Deleted bool `json:"deleted,omitempty"`
	// Stopped, when set, overrides the set's stopped key.
	Stopped *bool `json:"stopped,omitempty"`
	// Replicas, when set, overrides the set's declared replica count.
	Replicas *int `json:"replicas,omitempty"`
	// Restart is the progress of a rolling restart (a KindRestart
	// record), as the proxy running it writes it after every step:
	// another proxy takes it over from there if that proxy leaves.
	Restart json.RawMessage `json:"restart,omitempty"`
	// Action is the operator command that wrote this version: create,
	// delete, stop, start, scale, clear or restart.
	Action string `json:"action"`
	// By says who issued it (the admin API caller), Via through which
	// proxy (its fleet ID), At when (the writer's clock).
	By  string    `json:"by,omitempty"`
	Via string    `json:"via,omitempty"`
	At  time.Time `json:"at"`
}

// Key returns the record's key.
func (r Record) Key() Key { return Key{Kind: r.Kind, Set: r.Set} }

// plainRecord is Record without its JSON methods.
type plainRecord Record

// MarshalJSON writes the record with its wire key in "set".
func (r Record) MarshalJSON() ([]byte, error) {
	p := plainRecord(r)
	p.Set = r.Key().wire()
	return json.Marshal(p)
}

// UnmarshalJSON reads a record written by this version or an older one.
func (r *Record) UnmarshalJSON(b []byte) error {
	var p plainRecord
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*r = Record(p)
	k := parseKey(p.Set)
	r.Kind, r.Set = k.Kind, k.Set
	return nil
}

// Newer reports whether r wins over o (both of one key): the higher
// version, then the higher origin, then the later time. Writes of one
// version and one origin come from the two processes of one proxy during
// a binary upgrade (one ID, one host, so one clock): the later wins.
func (r Record) Newer(o Record) bool {
	if r.Version != o.Version {
		return r.Version > o.Version
	}
	if r.Origin != o.Origin {
		return r.Origin > o.Origin
	}
	return r.At.After(o.At)
}

// Overrides reports whether the record changes anything the file says.
func (r Record) Overrides() bool {
	return len(r.Spec) > 0 || r.Deleted || r.Stopped != nil || r.Replicas != nil
}
