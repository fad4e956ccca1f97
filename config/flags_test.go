package config

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestProxyFlags(t *testing.T) {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cf := NewProxyFlags(fs)
	if err := fs.Parse([]string{"-c", "../examples/minimal.yaml", "--listen", "127.0.0.1:0", "--join", "a:7946, b:7946", "--gossip-bind-addr", "127.0.0.1", "--set", "log.level=debug", "--set", "listen=127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if cf.File != "../examples/minimal.yaml" {
		t.Fatalf("File %q", cf.File)
	}
	cfg, err := Load(cf.File, append(cf.Options(), WithEnv(func(string) (string, bool) { return "", false }))...)
	if err != nil {
		t.Fatal(err)
	}
	// --set comes after the named flags: it wins.
	if cfg.Listen != "127.0.0.1:1" || cfg.Log.Level != "debug" {
		t.Errorf("listen %q, log.level %q", cfg.Listen, cfg.Log.Level)
	}
	if !cfg.Gossip.Enabled || strings.Join(cfg.Gossip.Join, ",") != "a:7946,b:7946" {
		t.Errorf("--join: gossip.enabled %v, join %v", cfg.Gossip.Enabled, cfg.Gossip.Join)
	}
}

func TestAgentFlags(t *testing.T) {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	af := NewAgentFlags(fs)
	if err := fs.Parse([]string{"--replica.set", "orders", "--replica.addr", "127.0.0.1:9001", "--gossip.join", "a:1", "--gossip.join", "b:2", "--drain.remove", "--gossip.insecure"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadAgent("", append(af.Options(), WithEnv(func(string) (string, bool) { return "", false }))...)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Replica.Set != "orders" || cfg.Replica.Addr != "127.0.0.1:9001" || strings.Join(cfg.Gossip.Join, ",") != "a:1,b:2" || !cfg.Drain.Remove || !cfg.Gossip.Insecure {
		t.Errorf("agent config from flags: %+v", cfg)
	}
	var help strings.Builder
	af.PrintDefaults(&help)
	if !strings.Contains(help.String(), "--replica.addr STRING") || !strings.Contains(help.String(), "--drain.remove\n") {
		t.Errorf("help:\n%s", help.String())
	}
}
