package config

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"

	"keyway/internal/strictjson"
	"keyway/proxy"
	"keyway/runstate"
)

// DecodeSet reads one replica set definition, a JSON object with the keys
// of one replica_sets entry of the configuration file, as the admin API's
// POST /v1/replica_sets receives it. It is decoded and validated exactly
// as a file's entry is (unknown keys, bad values and invalid settings are
// problems naming the key); src names the source in problems. Like the
// admin API's other JSON bodies (strictjson), it must be one object with
// nothing after it and no key twice. Problems are returned as an *Error.
func DecodeSet(src string, data []byte) (proxy.SetConfig, error) {
	trimmed := bytes.TrimSpace(data)
	if err := strictjson.Check(trimmed); err != nil {
		return proxy.SetConfig{}, &Error{Problems: []Problem{{File: src,
			Message: err.Error() + `; want one JSON object with the keys of a replica_sets entry, e.g. {"name": "orders", "match": {"path_prefix": "/orders"}, "replicas": 3}`}}}
	}
	root, probs := parseOneDocument(src, trimmed, false, "name, match, replicas, key, static, ...")
	if len(probs) > 0 {
		return proxy.SetConfig{}, &Error{Problems: probs}
	}
	v := newDefault(reflect.TypeOf(proxy.SetConfig{}))
	d := &decoder{src: src, positions: true, sources: []string{src}, locs: map[string]loc{}, maxNodes: maxNodes}
	d.decode(root, v, "")
	if d.tooBig {
		return proxy.SetConfig{}, &Error{Problems: d.probs[len(d.probs)-1:]}
	}
	sc := v.Interface().(proxy.SetConfig)
	for _, e := range leafErrors(sc.Validate()) {
		d.validationProblem(src, e.Error())
	}
	d.checkStatefulSetCount("", sc)
	if len(d.probs) > 0 {
		return proxy.SetConfig{}, &Error{Problems: sortProblems(d.sources, d.probs)}
	}
	return sc, nil
}

// RuntimeProblem is a run-time record this proxy could not apply: a set
// created at run time whose definition does not decode here, or conflicts
// with this proxy's file (the same match as another set). The set is left
// out on this proxy; the record stays, for the other proxies and for a
// later file that makes room for it.
type RuntimeProblem struct {
	Set     string
	Version uint64
	Problem string
}

// ApplyRuntime returns the configuration a proxy runs: its file's, with
// the run-time state laid over it. The run-time state wins, per set and
// per key it sets:
//
//   - a deleted set is left out, even when the file defines it;
//   - a set created at run time (Spec) is served with that definition, in
//     place of the file's entry of that name if there is one;
//   - stopped and replicas, when a record sets them, replace the file's.
//
// The file's sets keep their order; sets only the run-time state defines
// follow, sorted by name. A record that cannot be applied is left out and
// reported; of two sets created at run time that conflict (the same
// match, from two proxies at once), the first by name stays, on every
// proxy. file is not modified.
func ApplyRuntime(file Config, recs []runstate.Record) (Config, []RuntimeProblem) {
	recs = slices.DeleteFunc(slices.Clone(recs), func(r runstate.Record) bool { return r.Kind != runstate.KindSet })
	byName := make(map[string]runstate.Record, len(recs))
	for _, r := range recs {
		byName[r.Set] = r
	}
	out := file
	out.ReplicaSets = make([]proxy.SetConfig, 0, len(file.ReplicaSets)+len(recs))
	var probs []RuntimeProblem
	add := func(sc proxy.SetConfig, r runstate.Record, has bool) {
		if has {
			if r.Stopped != nil {
				sc.Stopped = *r.Stopped
			}
			if r.Replicas != nil {
				sc.Replicas = *r.Replicas
			}
		}
		out.ReplicaSets = append(out.ReplicaSets, sc)
	}
	var created []runstate.Record
	for _, sc := range file.ReplicaSets {
		r, has := byName[sc.Name]
		switch {
		case has && r.Deleted:
			continue
		case has && len(r.Spec) > 0:
			created = append(created, r) // its own definition replaces the file's
			continue
		}
		add(sc, r, has)
	}
	for _, r := range recs {
		if !r.Deleted && len(r.Spec) > 0 && !slices.ContainsFunc(file.ReplicaSets, func(sc proxy.SetConfig) bool { return sc.Name == r.Set }) {
			created = append(created, r)
		}
	}
	slices.SortFunc(created, func(a, b runstate.Record) int {
		switch {
		case a.Set < b.Set:
			return -1
		case a.Set > b.Set:
			return 1
		}
		return 0
	})
	for _, r := range created {
		sc, err := DecodeSet("replica set "+r.Set+" (created at run time)", r.Spec)
		if err == nil && sc.Name != r.Set {
			err = fmt.Errorf("its definition is named %q", sc.Name)
		}
		if err != nil {
			probs = append(probs, RuntimeProblem{Set: r.Set, Version: r.Version, Problem: err.Error()})
			continue
		}
		before := len(out.ReplicaSets)
		add(sc, r, true)
		if err := out.Config.Validate(); err != nil {
			// It conflicts with what this proxy serves: leave it out.
			out.ReplicaSets = out.ReplicaSets[:before]
			probs = append(probs, RuntimeProblem{Set: r.Set, Version: r.Version, Problem: err.Error()})
		}
	}
	out.Gone = goneRoutes(file, recs)
	return out, probs
}

// goneRoutes are the routes of the sets deleted at run time: the file's
// match of a set it defines, else the match of the definition the set
// was created with (a tombstone keeps it). A tombstone without either
// (written by an older keyway) has no route to keep.
func goneRoutes(file Config, recs []runstate.Record) []proxy.GoneRoute {
	var out []proxy.GoneRoute
	for _, r := range recs {
		if !r.Deleted {
			continue
		}
		i := slices.IndexFunc(file.ReplicaSets, func(sc proxy.SetConfig) bool { return sc.Name == r.Set })
		switch {
		case i >= 0:
			out = append(out, proxy.GoneRoute{Set: r.Set, Match: file.ReplicaSets[i].Match})
		case len(r.Spec) > 0:
			if sc, err := DecodeSet("replica set "+r.Set+" (deleted at run time)", r.Spec); err == nil {
				out = append(out, proxy.GoneRoute{Set: r.Set, Match: sc.Match})
			}
		}
	}
	return out
}
