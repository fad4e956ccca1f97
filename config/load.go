package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"keyway/membership"
	"keyway/proxy"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Option changes how Load reads a configuration.
type Option func(*options)

type options struct {
	env      func(string) (string, bool)
	sets     []override
	maxNodes int // tests lower it

	fileChecks bool // WithFileChecks (tlsfiles.go)
}

// override is one explicit value: source names it in errors.
type override struct{ source, path, value string }

// WithEnv sets the function used to look up KEYWAY_* environment
// variables. The default is os.LookupEnv; nil disables environment
// overrides (tests use a map lookup so they never touch the process
// environment). A variable that is set but empty sets its key to the
// empty (zero) value.
func WithEnv(lookup func(string) (string, bool)) Option {
	return func(o *options) { o.env = lookup }
}

// WithSet overrides one key after the file and the environment, as
// "--set path=value" does. The path is a YAML path: "log.level",
// "server.max_conns", or, unlike environment variables, an existing list
// entry such as "replica_sets[0].replicas". The value is YAML for
// non-string keys ("5000", "30s", "[{header: X-Tenant}]") and taken
// literally for strings. Problems name it "--set" (and the path). Later
// overrides win over earlier ones.
func WithSet(path, value string) Option {
	return WithFlag("--set", path, value)
}

// WithFlag is WithSet for a dedicated command-line flag: problems name the
// flag, e.g. WithFlag("--listen", "listen", ":9000").
func WithFlag(flag, path, value string) Option {
	return func(o *options) { o.sets = append(o.sets, override{source: flag, path: path, value: value}) }
}

// Load reads the YAML file at path and returns the configuration it
// describes, with defaults, environment and explicit overrides applied and
// every section validated. Problems with the configuration are reported
// together as an *Error; an unreadable file is a plain error that wraps
// the os error. Load keeps no state between calls and is safe for
// concurrent use.
func Load(path string, opts ...Option) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	return LoadBytes(path, data, opts...)
}

// LoadBytes is Load for a file already in memory; name is used in
// problems. On error the returned Config is the zero value: a partially
// decoded configuration is never handed out.
func LoadBytes(name string, data []byte, opts ...Option) (Config, error) {
	c, _, err := load(name, data, opts...)
	return c, err
}

// load does the work of LoadBytes and also returns where each key's value
// came from (the tests use it to check that full.yaml sets every key).
func load(name string, data []byte, opts ...Option) (Config, map[string]loc, error) {
	o := options{env: os.LookupEnv, maxNodes: maxNodes}
	for _, opt := range opts {
		opt(&o)
	}
	root, probs := parseDocument(name, data)
	if len(probs) > 0 {
		return Config{}, nil, &Error{Problems: probs}
	}

	cfg := Default()
	v := reflect.ValueOf(&cfg).Elem()
	d := &decoder{src: name, positions: true, sources: []string{name}, locs: map[string]loc{}, maxNodes: o.maxNodes}
	d.decode(root, v, "")
	if d.tooBig {
		return Config{}, nil, &Error{Problems: d.probs[len(d.probs)-1:]}
	}

	// Precedence: defaults < file < environment < flags.
	if o.env != nil {
		for _, p := range scalarPaths(v.Type(), "") {
			if val, ok := o.env(envName(p)); ok {
				d.override(v, "$"+envName(p), p, val)
			}
		}
	}
	for _, s := range o.sets {
		d.override(v, s.source, s.path, s.value)
	}

	for _, e := range leafErrors(cfg.Validate()) {
		d.validationProblem(name, e.Error())
	}
	for i, s := range cfg.ReplicaSets {
		d.checkStatefulSetCount(fmt.Sprintf("replica_sets[%d].", i), s)
	}
	if cfg.Gossip.Enabled {
		d.checkGossipKey(name, cfg.Gossip.Config, o.env)
		d.checkGossipCredentials(name, cfg.Gossip.Config, membership.RoleProxy, "", o.env)
	}
	d.checkAccessKey(name, cfg.Log, o.env)
	if o.fileChecks {
		d.checkTLSFiles(name, cfg)
	}
	if len(d.probs) > 0 {
		return Config{}, nil, &Error{Problems: sortProblems(d.sources, d.probs)}
	}
	return cfg, d.locs, nil
}

// parseDocument parses exactly one YAML document whose top level is a
// mapping. An empty file, a syntax error, a second document or another
// top-level shape is a problem.
func parseDocument(name string, data []byte) (*yaml.Node, []Problem) {
	return parseOneDocument(name, data, false, "listen, replica_sets, admin, ...")
}

// parseOneDocument parses at most one YAML document whose top level is a
// mapping of keys such as topKeys. With allowEmpty an empty document gives
// a nil root and no problem.
func parseOneDocument(name string, data []byte, allowEmpty bool, topKeys string) (*yaml.Node, []Problem) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF) && allowEmpty:
		return nil, nil
	case errors.Is(err, io.EOF):
		return nil, []Problem{{File: name, Message: emptyMessage}}
	case err != nil:
		return nil, []Problem{syntaxProblem(name, data, err)}
	}
	var probs []Problem
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		probs = append(probs, Problem{File: name, Line: next.Line, Column: next.Column,
			Message: "a second YAML document starts here; keyway reads one document per file: remove this \"---\" and what follows it, or merge the documents"})
	case !errors.Is(err, io.EOF):
		probs = append(probs, syntaxProblem(name, data, err))
	}
	root := doc.Content[0]
	switch {
	case isNull(root) && allowEmpty:
		root = nil
	case isNull(root):
		probs = append(probs, Problem{File: name, Message: emptyMessage})
	case root.Kind != yaml.MappingNode:
		probs = append(probs, Problem{File: name, Line: root.Line, Column: root.Column,
			Message: fmt.Sprintf("the top level must be a mapping of keys (%s), got %s", topKeys, describeNode(root))})
	}
	return root, probs
}

const emptyMessage = `the file is empty (or only comments); it needs at least one replica set, e.g. replica_sets: [{name: orders, static: [{name: orders-0, addr: "127.0.0.1:9001"}]}]`

// syntaxProblem turns a yaml.v3 error ("yaml: line 3: mapping values are
// not allowed in this context") into a problem at the line of data where
// the problem is.
//
// yaml.v3 does not always report that line. A scanner error is reported at
// the start of the token being scanned (its "context mark") when it has
// one: a tab that breaks the indentation on line 4, in the continuation of
// a value that starts on line 3, is "line 3". A parser error's line is
// the context's, 0-based: one line early. So the line is found again: the
// first prefix of the file, from the reported line on, that fails with the
// same message ends at the line of the problem. (A prefix that ends before
// it parses, or fails differently: the problem is not in it.)
func syntaxProblem(name string, data []byte, err error) Problem {
	line, text := splitYAMLError(err)
	p := Problem{File: name, Line: line, Message: "invalid YAML: " + text}
	if line == 0 {
		return p
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	for l := line; l <= len(lines) && l < line+1000; l++ {
		if e := firstYAMLError(bytes.Join(lines[:l], nil)); e != nil {
			if _, t := splitYAMLError(e); t == text {
				p.Line = l
			}
			break
		}
	}
	if p.Line <= len(lines) {
		indent := lines[p.Line-1][:len(lines[p.Line-1])-len(bytes.TrimLeft(lines[p.Line-1], " \t"))]
		if bytes.ContainsRune(indent, '\t') {
			p.Message += "; this line is indented with a tab: YAML indents with spaces only"
		}
	}
	return p
}

// splitYAMLError splits "yaml: line 3: text" into 3 and "text" (0 when
// the error names no line).
func splitYAMLError(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, text, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				return n, text
			}
		}
	}
	return 0, msg
}

// firstYAMLError is the first syntax error of data as parseOneDocument
// meets it (in its first two documents), or nil.
func firstYAMLError(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for range 2 {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
	return nil
}

// override applies one environment variable or explicit value. The path
// may step into existing list entries ("replica_sets[0].replicas").
func (d *decoder) override(root reflect.Value, source, path, value string) {
	d.src, d.positions = source, false
	if !slices.Contains(d.sources, source) {
		d.sources = append(d.sources, source)
	}
	segs, err := parsePath(path)
	if err != nil {
		d.problem(nil, "", "%v", err)
		return
	}
	v, canon := root, ""
	for _, s := range segs {
		if v.Kind() != reflect.Struct || isScalar(v.Type()) {
			d.problem(nil, canon, "is a single value; it has no key %q", s.key)
			return
		}
		fs := fieldsOf(v.Type())
		f, ok := lookupField(fs, s.key)
		if !ok {
			d.problem(nil, joinKey(canon, s.key), "%s", d.unknownKey(s.key, fs))
			return
		}
		v, canon = v.FieldByIndex(f.index), joinKey(canon, s.key)
		for _, i := range s.index {
			if v.Kind() != reflect.Slice || isScalar(v.Type()) {
				d.problem(nil, canon, "is not a list; [%d] does not apply", i)
				return
			}
			if i >= v.Len() && v.Len() == 1 {
				d.problem(nil, canon, "has 1 entry, so [%d] does not exist; an override can change an entry the file has, not add one", i)
				return
			}
			if i >= v.Len() {
				d.problem(nil, canon, "has %d entries, so [%d] does not exist; an override can change an entry the file has, not add one", v.Len(), i)
				return
			}
			v, canon = v.Index(i), fmt.Sprintf("%s[%d]", canon, i)
		}
	}

	var n *yaml.Node
	if v.Kind() == reflect.String || isText(v.Type()) {
		// Strings are taken literally: "KEYWAY_ADMIN_LISTEN=" is "", not null.
		n = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value}
	} else {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(value), &doc); err != nil {
			d.problem(nil, canon, "%q is not a valid value: %s", value, strings.TrimPrefix(err.Error(), "yaml: "))
			return
		}
		n = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"}
		if len(doc.Content) > 0 {
			n = doc.Content[0]
		}
	}
	for p := range d.locs {
		if under(p, canon) {
			delete(d.locs, p)
		}
	}
	d.locs[canon] = loc{file: source}
	d.decode(n, v, canon)
}

// validationProblem turns one error from Config.Validate into a problem
// located at the value it is about. The error starts with the YAML path;
// when the key is not in the file (the value is a default), the problem
// points at its nearest parent that is, and says so.
func (d *decoder) validationProblem(file, msg string) {
	path, rest, ok := strings.Cut(msg, ": ")
	if !ok || !isPath(path) {
		d.probs = append(d.probs, Problem{File: file, Message: msg})
		return
	}
	for _, f := range d.failed {
		if under(path, f) {
			return // already reported as a decoding problem; its value is only the default
		}
	}
	p := Problem{File: file, Path: path, Message: rest}
	for at := path; ; at = parentPath(at) {
		l, found := d.locs[at]
		if found {
			p.File, p.Line, p.Column = l.file, l.line, l.col
		}
		if found || at == "" {
			if at != path {
				if p.File == file {
					p.Message += " (default value: not in the file)"
				} else {
					p.Message += " (default value)"
				}
			}
			break
		}
	}
	d.probs = append(d.probs, p)
}

// sortProblems orders problems by where they come from (sources: the file
// first, then overrides in the order they were applied) and then by
// position, and drops repeats: a value reached through several aliases or
// "<<" merges is reported once, at its first path.
func sortProblems(sources []string, probs []Problem) []Problem {
	rank := map[string]int{}
	for i, s := range sources {
		rank[s] = i
	}
	slices.SortStableFunc(probs, func(a, b Problem) int {
		if c := rank[a.File] - rank[b.File]; c != 0 {
			return c
		}
		if a.Line != b.Line {
			return a.Line - b.Line
		}
		return a.Column - b.Column
	})
	seen := map[Problem]bool{}
	return slices.DeleteFunc(probs, func(p Problem) bool {
		if p.Line > 0 {
			// The same place in the file, reached through another entry.
			p.Path = stripIndexes(p.Path)
		}
		dup := seen[p]
		seen[p] = true
		return dup
	})
}

// stripIndexes writes every list index of a path as []:
// "replica_sets[1].static[0]" → "replica_sets[].static[]".
func stripIndexes(p string) string {
	var b strings.Builder
	skip := false
	for _, c := range p {
		switch {
		case c == '[':
			skip = true
			b.WriteString("[]")
		case c == ']':
			skip = false
		case !skip:
			b.WriteRune(c)
		}
	}
	return b.String()
}

// checkStatefulSetCount refuses a replicas key in a set that names a
// StatefulSet: the StatefulSet's spec.replicas is the count, and a second
// one could only disagree with it. prefix is the set's YAML path.
func (d *decoder) checkStatefulSetCount(prefix string, s proxy.SetConfig) {
	l, ok := d.locs[prefix+"replicas"]
	if !s.StatefulSet.Enabled() || !ok {
		return
	}
	d.probs = append(d.probs, Problem{File: l.file, Line: l.line, Column: l.col, Path: prefix + "replicas",
		Message: fmt.Sprintf("the set's count is its StatefulSet's spec.replicas (%s): remove replicas here, and scale with keyway scale or kubectl scale", s.StatefulSet.Name)})
}
