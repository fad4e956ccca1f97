package config

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// keyFlag is the flag of one agent configuration key. It keeps the raw
// text; the config loader parses it like a value from the environment.
type keyFlag struct {
	path        string
	isBool      bool
	isList      bool
	placeholder string // names the value in --help; "" for booleans
	values      []string
}

func (f *keyFlag) String() string {
	if f == nil {
		return ""
	}
	return strings.Join(f.values, ",")
}

func (f *keyFlag) Set(s string) error {
	if f.isList {
		f.values = append(f.values, s)
	} else {
		f.values = []string{s}
	}
	return nil
}

// IsBoolFlag lets "--drain.remove" stand for "--drain.remove=true".
func (f *keyFlag) IsBoolFlag() bool { return f.isBool }

// placeholders name a flag's value in --help, by key type.
var placeholders = map[string]string{"string": "STRING", "int": "N", "duration": "DURATION", "list": "LIST"}

// AgentFlags are the agent's command-line flags: one per configuration key,
// named by its path ("--replica.addr", "--gossip.join"), each overriding
// the file and the environment. Not safe for concurrent use.
type AgentFlags struct {
	fs   *flag.FlagSet
	keys []*keyFlag
}

// NewAgentFlags defines a flag for every agent configuration key on fs.
func NewAgentFlags(fs *flag.FlagSet) *AgentFlags {
	a := &AgentFlags{fs: fs}
	for _, f := range DescribeAgent() {
		kf := &keyFlag{path: f.Path, isBool: f.Type == "bool", isList: f.Type == "list", placeholder: placeholders[f.Type]}
		fs.Var(kf, f.Path, fmt.Sprintf("%s (default %s; $%s)", f.Doc, f.Default, f.Env))
		a.keys = append(a.keys, kf)
	}
	return a
}

// Options returns the load options of the flags given (after fs.Parse),
// for LoadAgent.
func (a *AgentFlags) Options() []Option {
	var opts []Option
	for _, k := range a.keys {
		if len(k.values) > 0 {
			opts = append(opts, WithFlag("--"+k.path, k.path, k.String()))
		}
	}
	return opts
}

// PrintDefaults lists every flag of the flag set as "--name VALUE" and its
// usage.
func (a *AgentFlags) PrintDefaults(w io.Writer) {
	a.fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		if kf, ok := f.Value.(*keyFlag); ok {
			name = kf.placeholder
		}
		if name != "" {
			name = " " + name
		}
		dashes := "--"
		if len(f.Name) == 1 {
			dashes = "-"
		}
		fmt.Fprintf(w, "  %s%s%s\n    \t%s\n", dashes, f.Name, name, usage)
	})
}

// ProxyFlags are the command-line flags of keyway proxy, validate and
// demo: -c FILE, a few named flags for common keys (--listen,
// --log-level, --join, ...) and --set PATH=VALUE for any key. Each
// overrides the file and the environment. Not safe for concurrent use.
type ProxyFlags struct {
	// File is the configuration file given with -c or --config.
	File  string
	fs    *flag.FlagSet
	sets  []Option
	named []namedFlag
}

type namedFlag struct {
	flag, path, help string
	value            *string
}

// NewProxyFlags defines the flags on fs.
func NewProxyFlags(fs *flag.FlagSet) *ProxyFlags {
	cf := &ProxyFlags{fs: fs}
	fs.StringVar(&cf.File, "c", "", "configuration `FILE` (YAML); required")
	fs.StringVar(&cf.File, "config", "", "same as -c")
	for _, nf := range []namedFlag{
		{flag: "listen", path: "listen", help: "proxy listen `ADDR` (config key listen)"},
		{flag: "admin-listen", path: "admin.listen", help: "admin listen `ADDR` (config key admin.listen)"},
		{flag: "log-level", path: "log.level", help: "log `LEVEL`: debug, info, warn, error (config key log.level)"},
		{flag: "log-format", path: "log.format", help: "log `FORMAT`: json or console (config key log.format)"},
		{flag: "access-log", path: "log.access_log", help: "`true` to write an access log to stdout (config key log.access_log)"},
		{flag: "join", path: "gossip.join", help: "gossip `ADDRS` to join, comma-separated host:port; turns gossip on (config keys gossip.join, gossip.enabled)"},
		{flag: "gossip-bind-addr", path: "gossip.bind_addr", help: "gossip bind `IP` (config key gossip.bind_addr)"},
		{flag: "gossip-bind-port", path: "gossip.bind_port", help: "gossip `PORT`, 0 for any free port (config key gossip.bind_port)"},
	} {
		nf.value = new(string)
		fs.StringVar(nf.value, nf.flag, "", nf.help)
		cf.named = append(cf.named, nf)
	}
	fs.Func("set", "override any config key: `PATH=VALUE`, e.g. --set server.max_conns=5000 (repeatable)", func(s string) error {
		path, value, ok := strings.Cut(s, "=")
		if !ok || path == "" {
			return fmt.Errorf("want PATH=VALUE, got %q", s)
		}
		cf.sets = append(cf.sets, WithSet(path, value))
		return nil
	})
	return cf
}

// Options returns the load options of the flags given (after fs.Parse) in
// precedence order: named flags, then --set (later wins).
func (cf *ProxyFlags) Options() []Option {
	var opts []Option
	set := map[string]bool{}
	cf.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, nf := range cf.named {
		if !set[nf.flag] {
			continue
		}
		if nf.flag == "join" {
			var quoted []string
			for _, a := range strings.Split(*nf.value, ",") {
				if a = strings.TrimSpace(a); a != "" {
					quoted = append(quoted, strconv.Quote(a))
				}
			}
			opts = append(opts,
				WithFlag("--join", "gossip.enabled", "true"),
				WithFlag("--join", "gossip.join", "["+strings.Join(quoted, ", ")+"]"))
			continue
		}
		opts = append(opts, WithFlag("--"+nf.flag, nf.path, *nf.value))
	}
	return append(opts, cf.sets...)
}
