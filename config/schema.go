package config

import (
	"encoding"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
)

// This file describes the shape of the configuration as the YAML sees it:
// which keys a struct has (yaml tags, ",inline"), which types are scalars,
// and how YAML paths are written and split.

var (
	durationType        = reflect.TypeFor[time.Duration]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// field is one key of a struct as the YAML sees it.
type field struct {
	name  string
	index []int // for reflect.Value.FieldByIndex; longer than 1 through ",inline"
	typ   reflect.Type
}

// yamlName returns a struct field's YAML key the way yaml.v3 derives it:
// the tag's name, else the lower-cased field name. inline reports a
// ",inline" field, skip an unexported or "-" one.
func yamlName(sf reflect.StructField) (name string, inline, skip bool) {
	tag := sf.Tag.Get("yaml")
	if tag == "-" {
		return "", false, true
	}
	name, opts, _ := strings.Cut(tag, ",")
	for _, o := range strings.Split(opts, ",") {
		if o == "inline" {
			inline = true
		}
	}
	if !sf.IsExported() && !(sf.Anonymous && inline) {
		return "", false, true
	}
	if name == "" {
		name = strings.ToLower(sf.Name)
	}
	return name, inline, false
}

// fieldsOf lists the YAML keys of struct type t in declaration order,
// flattening ",inline" fields. Two fields with the same key are a
// programming error and panic (every config type is exercised by the
// tests through Describe).
func fieldsOf(t reflect.Type) []field {
	var out []field
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := 0; i < t.NumField(); i++ {
			sf := t.Field(i)
			name, inline, skip := yamlName(sf)
			if skip {
				continue
			}
			idx := append(append([]int(nil), index...), i)
			if inline {
				if sf.Type.Kind() != reflect.Struct {
					panic(fmt.Sprintf("config: %s.%s: ,inline needs a struct, got %s", t, sf.Name, sf.Type))
				}
				walk(sf.Type, idx)
				continue
			}
			out = append(out, field{name: name, index: idx, typ: sf.Type})
		}
	}
	walk(t, nil)
	seen := map[string]bool{}
	for _, f := range out {
		if seen[f.name] {
			panic(fmt.Sprintf("config: %s has two fields with the YAML key %q", t, f.name))
		}
		seen[f.name] = true
	}
	return out
}

func lookupField(fs []field, name string) (field, bool) {
	for _, f := range fs {
		if f.name == name {
			return f, true
		}
	}
	return field{}, false
}

func fieldNames(fs []field) []string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.name
	}
	return names
}

// isText reports whether t is decoded from a scalar by its pointer's
// UnmarshalText (proxy.ByteSize, balancer.Fallback, ...).
func isText(t reflect.Type) bool {
	return reflect.PointerTo(t).Implements(textUnmarshalerType)
}

// isScalar reports whether values of t are written as one YAML scalar.
func isScalar(t reflect.Type) bool {
	if t == durationType || isText(t) {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

// joinKey appends a key to a YAML path: "" + "listen" is "listen",
// "server" + "max_conns" is "server.max_conns".
func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// under reports whether path p is q or lies inside q.
func under(p, q string) bool {
	if q == "" {
		return true
	}
	return p == q || strings.HasPrefix(p, q+".") || strings.HasPrefix(p, q+"[")
}

// parentPath strips the last key or index from a path:
// "replica_sets[0].timeouts" → "replica_sets[0]" → "replica_sets" → "".
func parentPath(p string) string {
	if strings.HasSuffix(p, "]") {
		if i := strings.LastIndexByte(p, '['); i >= 0 {
			return p[:i]
		}
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}

// isPath reports whether s looks like a YAML path as the components' Validate
// errors write them: keys of [a-z0-9_] separated by dots, each optionally
// followed by [N] indexes.
func isPath(s string) bool {
	if s == "" {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		key, idx, _ := strings.Cut(part, "[")
		if key == "" {
			return false
		}
		for _, c := range key {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				return false
			}
		}
		if idx != "" {
			for _, c := range "[" + idx {
				if !(c >= '0' && c <= '9' || c == '[' || c == ']') {
					return false
				}
			}
			if !strings.HasSuffix(idx, "]") {
				return false
			}
		}
	}
	return true
}

// segment is one step of a path given by the user (--set a.b[2].c).
type segment struct {
	key   string
	index []int
}

// parsePath splits "replica_sets[0].timeouts.connect" into segments.
func parsePath(p string) ([]segment, error) {
	if p == "" {
		return nil, fmt.Errorf("empty path; write a key such as log.level")
	}
	var out []segment
	for _, part := range strings.Split(p, ".") {
		key, rest, _ := strings.Cut(part, "[")
		if key == "" {
			return nil, fmt.Errorf("%q is not a key path; write keys separated by dots, e.g. replica_sets[0].replicas", p)
		}
		s := segment{key: key}
		if rest != "" {
			for _, ix := range strings.Split("["+rest, "[")[1:] {
				n, ok := strings.CutSuffix(ix, "]")
				var i int
				if _, err := fmt.Sscanf(n, "%d", &i); !ok || err != nil || i < 0 || fmt.Sprint(i) != n {
					return nil, fmt.Errorf("%q is not a key path; list indexes are written [0], [1], ...", p)
				}
				s.index = append(s.index, i)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// envName is the environment variable that overrides a key outside lists:
// KEYWAY_ followed by the path in upper case with dots as underscores.
func envName(path string) string {
	return "KEYWAY_" + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
}

// scalarPaths lists the paths of every scalar key of t that is not inside a
// list: the keys that have an environment variable.
func scalarPaths(t reflect.Type, prefix string) []string {
	var out []string
	for _, f := range fieldsOf(t) {
		p := joinKey(prefix, f.name)
		switch {
		case isScalar(f.typ):
			out = append(out, p)
		case f.typ.Kind() == reflect.Struct:
			out = append(out, scalarPaths(f.typ, p)...)
		}
	}
	return out
}

// suggest returns the candidate closest to key if it is close enough to be a
// likely typo: at most two edits (insertions, deletions, substitutions or
// transpositions of adjacent letters), ignoring case, '-' for '_' and
// missing '_'. Failing that, the one candidate that has key as one of its
// '_'-separated words.
func suggest(key string, candidates []string) (string, bool) {
	norm := func(s string) string {
		return strings.ReplaceAll(strings.ToLower(s), "-", "_")
	}
	best, bestD := "", 3
	k := norm(key)
	for _, c := range candidates {
		d := editDistance(k, norm(c))
		if strings.ReplaceAll(k, "_", "") == strings.ReplaceAll(c, "_", "") {
			d = 0 // maxConns, max-conns, MAX_CONNS
		}
		if d < bestD && d < len([]rune(k)) {
			best, bestD = c, d
		}
	}
	if best != "" {
		return best, true
	}
	// "idle" for "idle_timeout", "conns" for "max_conns": a whole word of
	// exactly one candidate.
	var hits []string
	for _, c := range candidates {
		if slices.Contains(strings.Split(c, "_"), k) || strings.HasPrefix(c, k+"_") || strings.HasSuffix(c, "_"+k) {
			hits = append(hits, c)
		}
	}
	if len(hits) == 1 {
		return hits[0], true
	}
	return "", false
}

// editDistance is the optimal-string-alignment distance between a and b:
// Levenshtein plus transposition of two adjacent characters ("nmae").
func editDistance(a, b string) int {
	s, t := []rune(a), []rune(b)
	d := make([][]int, len(s)+1)
	for i := range d {
		d[i] = make([]int, len(t)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(s); i++ {
		for j := 1; j <= len(t); j++ {
			cost := 1
			if s[i-1] == t[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && s[i-1] == t[j-2] && s[i-2] == t[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(s)][len(t)]
}

// elsewhere lists the full paths (list elements written as []) under root
// type t whose last key is name: "level" → ["log.level"]. It helps with a
// key written in the wrong section.
func elsewhere(t reflect.Type, name string) []string {
	var out []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for _, f := range fieldsOf(t) {
			p := joinKey(prefix, f.name)
			if f.name == name {
				out = append(out, p)
			}
			ft := f.typ
			if ft.Kind() == reflect.Slice && !isScalar(ft.Elem()) {
				ft, p = ft.Elem(), p+"[]"
			}
			if ft.Kind() == reflect.Struct && !isScalar(ft) {
				walk(ft, p)
			}
		}
	}
	walk(t, "")
	sort.Strings(out)
	return out
}

// deepCopy copies v so that the copy shares no slice with v.
func deepCopy(v reflect.Value) reflect.Value {
	out := reflect.New(v.Type()).Elem()
	switch v.Kind() {
	case reflect.Struct:
		out.Set(v)
		for i := 0; i < v.NumField(); i++ {
			if out.Field(i).CanSet() {
				out.Field(i).Set(deepCopy(v.Field(i)))
			}
		}
	case reflect.Slice:
		if v.IsNil() {
			return out
		}
		out.Set(reflect.MakeSlice(v.Type(), v.Len(), v.Len()))
		for i := 0; i < v.Len(); i++ {
			out.Index(i).Set(deepCopy(v.Index(i)))
		}
	default:
		out.Set(v)
	}
	return out
}
