package config

import (
	"encoding"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// maxNodes bounds the values one load visits, aliases expanded, so that a
// small file of nested aliases ("billion laughs") cannot make the loader
// spin. A thousand replica sets of a hundred static replicas stay well
// below it.
const maxNodes = 1_000_000

// loc is where a value came from: a file position, or an override's
// source ("$KEYWAY_LISTEN", "--listen") with Line 0.
type loc struct {
	file      string
	line, col int
}

// decoder walks a yaml.Node tree against Go types, filling values in place
// and collecting every problem instead of stopping at the first. It is not
// safe for concurrent use.
type decoder struct {
	src       string         // the file name or override source, for problems and locs
	positions bool           // whether node lines mean anything (false for overrides)
	sources   []string       // every src in the order applied, the file first
	locs      map[string]loc // YAML path → where its value was set
	probs     []Problem
	failed    []string // paths whose value could not be decoded
	nodes     int      // values visited, aliases expanded
	maxNodes  int      // limit on nodes
	tooBig    bool     // nodes passed maxNodes: decoding stopped
}

// problem reports a problem at node n (nil: no position) and path.
func (d *decoder) problem(n *yaml.Node, path, format string, args ...any) {
	p := Problem{File: d.src, Path: path, Message: fmt.Sprintf(format, args...)}
	if n != nil && d.positions {
		p.Line, p.Column = n.Line, n.Column
	}
	d.probs = append(d.probs, p)
}

// badValue reports a value that could not be decoded. The key keeps its
// previous value, so Validate's complaints about it would only confuse:
// they are dropped (see validationProblem).
func (d *decoder) badValue(n *yaml.Node, path, format string, args ...any) {
	d.problem(n, path, format, args...)
	d.failed = append(d.failed, path)
}

// record notes where the value at path was set: the key's position for a
// collection (its value starts on the next line), the value's for a scalar.
func (d *decoder) record(path string, key, val *yaml.Node) {
	n := val
	if key != nil && val.Kind != yaml.ScalarNode && val.Kind != yaml.AliasNode {
		n = key
	}
	l := loc{file: d.src}
	if d.positions {
		l.line, l.col = n.Line, n.Column
	}
	d.locs[path] = l
}

// decode sets v, which must be settable, from n. Structs are merged key by
// key into their current (default) values; lists are replaced, each element
// starting from newDefault.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	at := n
	for depth := 0; n.Kind == yaml.AliasNode; depth++ {
		if n.Alias == nil || depth > 100 {
			d.badValue(at, path, "alias *%s does not resolve to a value", at.Value)
			return
		}
		n = n.Alias
	}
	if d.nodes++; d.nodes > d.maxNodes {
		if !d.tooBig {
			d.tooBig = true
			d.problem(at, path, "the document expands to more than %d values (nested aliases?); refusing to read it", d.maxNodes)
		}
		return
	}
	t := v.Type()
	switch {
	case t == durationType:
		d.duration(n, at, v, path)
	case isText(t):
		d.text(n, at, v, path)
	case t.Kind() == reflect.Struct:
		d.mapping(n, at, v, path)
	case t.Kind() == reflect.Slice:
		d.sequence(n, at, v, path)
	case isScalar(t):
		d.scalar(n, at, v, path)
	default:
		panic(fmt.Sprintf("config: %s: unsupported field type %s", path, t))
	}
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describeNode says what a value is in an error message: a quoted scalar,
// "a mapping" or "a list".
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

// pairs returns a mapping's key/value pairs with "<<" merge keys expanded
// (explicit keys win over merged ones) and reports duplicate keys and keys
// that are not plain scalars; those pairs are dropped.
func (d *decoder) pairs(n *yaml.Node, path string) [][2]*yaml.Node {
	return d.pairsOf(n, path, map[*yaml.Node]bool{})
}

// pairsOf is pairs; visiting holds the mappings being expanded, because
// yaml.v3 lets an anchored mapping merge itself ("&a {<<: *a}").
func (d *decoder) pairsOf(n *yaml.Node, path string, visiting map[*yaml.Node]bool) [][2]*yaml.Node {
	visiting[n] = true
	defer delete(visiting, n)
	var explicit, merged [][2]*yaml.Node
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.problem(k, path, "a key must be a plain name, got %s", describeNode(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			merged = append(merged, d.mergeSources(val, path, visiting)...)
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.problem(k, joinKey(path, k.Value), "key %q is already defined at line %d; write each key once", k.Value, first.Line)
			continue
		}
		seen[k.Value] = k
		explicit = append(explicit, [2]*yaml.Node{k, val})
	}
	var out [][2]*yaml.Node
	for _, p := range merged {
		if _, ok := seen[p[0].Value]; !ok {
			seen[p[0].Value] = p[0]
			out = append(out, p)
		}
	}
	return append(out, explicit...)
}

// mergeSources returns the pairs a "<<" key merges in: those of one
// mapping, or of a list of mappings (earlier ones win, as YAML specifies).
func (d *decoder) mergeSources(val *yaml.Node, path string, visiting map[*yaml.Node]bool) [][2]*yaml.Node {
	var sources []*yaml.Node
	switch resolved := resolveAlias(val); resolved.Kind {
	case yaml.MappingNode:
		sources = []*yaml.Node{val}
	case yaml.SequenceNode:
		sources = resolved.Content
	default:
		d.problem(val, path, "<< merges a mapping (or a list of mappings), got %s", describeNode(resolved))
		return nil
	}
	var out [][2]*yaml.Node
	seen := map[string]bool{}
	for _, src := range sources {
		m := resolveAlias(src)
		if d.nodes++; m.Kind != yaml.MappingNode || visiting[m] || d.nodes > d.maxNodes {
			switch {
			case m.Kind != yaml.MappingNode:
				d.problem(src, path, "<< merges a mapping (or a list of mappings), got %s", describeNode(m))
			case visiting[m]:
				d.problem(src, path, "<< merges a mapping into itself")
			}
			continue
		}
		for _, p := range d.pairsOf(m, path, visiting) {
			if !seen[p[0].Value] {
				seen[p[0].Value] = true
				out = append(out, p)
			}
		}
	}
	return out
}

// resolveAlias follows *alias references to the anchored node.
func resolveAlias(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func (d *decoder) mapping(n, at *yaml.Node, v reflect.Value, path string) {
	if isNull(n) {
		return // "server:" with nothing under it keeps the defaults
	}
	if n.Kind != yaml.MappingNode {
		d.badValue(at, path, "expected a mapping of keys, got %s", describeNode(n))
		return
	}
	fs := fieldsOf(v.Type())
	for _, p := range d.pairs(n, path) {
		k, val := p[0], p[1]
		child := joinKey(path, k.Value)
		f, ok := lookupField(fs, k.Value)
		if !ok {
			d.problem(k, child, "%s", d.unknownKey(k.Value, fs))
			continue
		}
		d.record(child, k, val)
		d.decode(val, v.FieldByIndex(f.index), child)
	}
}

// unknownKey words the message for a key a struct does not have: the
// closest allowed key, else where that key does exist, else all allowed keys.
func (d *decoder) unknownKey(key string, fs []field) string {
	names := fieldNames(fs)
	if s, ok := suggest(key, names); ok {
		return fmt.Sprintf("unknown key %q; did you mean %q?", key, s)
	}
	if other := elsewhere(reflect.TypeFor[Config](), key); len(other) > 0 {
		return fmt.Sprintf("unknown key %q here (%s is a key of another section); allowed keys here: %s", key, strings.Join(other, " and "), strings.Join(names, ", "))
	}
	return fmt.Sprintf("unknown key %q; allowed keys: %s", key, strings.Join(names, ", "))
}

func (d *decoder) sequence(n, at *yaml.Node, v reflect.Value, path string) {
	if isNull(n) {
		v.Set(reflect.Zero(v.Type())) // "static:" with nothing under it: an empty list
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.badValue(at, path, "expected a list, got %s", describeNode(n))
		return
	}
	out := reflect.MakeSlice(v.Type(), 0, len(n.Content))
	for i, item := range n.Content {
		if d.tooBig {
			return
		}
		child := fmt.Sprintf("%s[%d]", path, i)
		d.record(child, nil, item)
		elem := newDefault(v.Type().Elem())
		d.decode(item, elem, child)
		out = reflect.Append(out, elem)
	}
	v.Set(out)
}

func (d *decoder) duration(n, at *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode {
		d.badValue(at, path, "expected a duration such as \"5s\", got %s", describeNode(n))
		return
	}
	switch n.ShortTag() {
	case "!!null":
		v.SetInt(0)
		return
	case "!!int", "!!float":
		// yaml.v2 and sigs.k8s.io/yaml read "5" as 5ns; never guess.
		d.badValue(at, path, "%s is a bare number; write a duration with a unit, e.g. \"%ss\"", n.Value, n.Value)
		return
	}
	dur, err := time.ParseDuration(strings.TrimSpace(n.Value))
	if err != nil {
		d.badValue(at, path, "%q is not a duration; write a number with a unit (ns, us, ms, s, m, h), e.g. \"2s\", \"500ms\" or \"1m30s\"", n.Value)
		return
	}
	v.SetInt(int64(dur))
}

func (d *decoder) text(n, at *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode {
		d.badValue(at, path, "expected a single value, got %s", describeNode(n))
		return
	}
	val := n.Value
	if isNull(n) {
		val = ""
	}
	if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(val)); err != nil {
		d.badValue(at, path, "%v", err)
	}
}

func (d *decoder) scalar(n, at *yaml.Node, v reflect.Value, path string) {
	k := v.Kind()
	want := "a whole number"
	switch k {
	case reflect.String:
		want = "a string"
	case reflect.Bool:
		want = "true or false"
	case reflect.Float32, reflect.Float64:
		want = "a number"
	}
	if n.Kind != yaml.ScalarNode {
		d.badValue(at, path, "expected %s, got %s", want, describeNode(n))
		return
	}
	tag := n.ShortTag()
	if tag == "!!null" {
		v.Set(reflect.Zero(v.Type()))
		return
	}
	bad := func() { d.badValue(at, path, "expected %s, got %s", want, describeNode(n)) }
	switch k {
	case reflect.String:
		// Like yaml.v3, take any scalar's text: "zone: 1" is the string "1".
		v.SetString(n.Value)
	case reflect.Bool:
		var b bool
		if tag != "!!bool" || n.Decode(&b) != nil {
			bad()
			return
		}
		v.SetBool(b)
	case reflect.Float32, reflect.Float64:
		var f float64
		if (tag != "!!float" && tag != "!!int") || n.Decode(&f) != nil {
			bad()
			return
		}
		if v.OverflowFloat(f) {
			d.badValue(at, path, "%s is out of range for this key", n.Value)
			return
		}
		v.SetFloat(f)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		var i int64
		if tag != "!!int" || n.Decode(&i) != nil {
			if tag == "!!float" && strings.Trim(n.Value, "+-0123456789_") == "" {
				// yaml.v3 resolves integers beyond int64 as floats.
				d.badValue(at, path, "%s is out of range for this key", n.Value)
				return
			}
			if tag == "!!float" {
				d.badValue(at, path, "expected a whole number, got %s", n.Value)
				return
			}
			bad()
			return
		}
		if v.OverflowInt(i) {
			d.badValue(at, path, "%s is out of range for this key", n.Value)
			return
		}
		v.SetInt(i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		var u uint64
		if tag != "!!int" || n.Decode(&u) != nil {
			bad()
			return
		}
		if v.OverflowUint(u) {
			d.badValue(at, path, "%s is out of range for this key", n.Value)
			return
		}
		v.SetUint(u)
	}
}
