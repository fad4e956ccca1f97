package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"keyway/config"
)

// keyway has two configuration files: the proxy's (keyway proxy,
// validate, demo) and the agent's (keyway agent). Given the other one, a
// command would list every key as unknown; instead validate checks an
// agent's file as one, and the other commands say which command reads it.

// hintError is an error with a line of advice after it (or, with first,
// before it: the file is of the other kind, and its problems are only
// what follows from that); errors.As still finds what it wraps (exit
// codes).
type hintError struct {
	err   error
	hint  string
	first bool
}

func (e hintError) Error() string {
	if e.first {
		return e.hint + "\n" + e.err.Error()
	}
	return e.err.Error() + "\n" + e.hint
}

func (e hintError) Unwrap() error { return e.err }

// fileKind reads file and tells which configuration it is (KindUnknown
// when it cannot be read).
func fileKind(file string) (kind config.FileKind, agentKeys, proxyKeys []string) {
	data, err := os.ReadFile(file)
	if err != nil {
		return config.KindUnknown, nil, nil
	}
	return config.DetectKind(data)
}

// proxyFileHint adds to a problem loading file as the proxy's
// configuration what to do when it is (or has keys of) the agent's.
func proxyFileHint(err error, file string) error {
	if _, ok := errors.AsType[*config.Error](err); !ok {
		return err
	}
	switch kind, agentKeys, proxyKeys := fileKind(file); kind {
	case config.KindAgent:
		return hintError{err, fmt.Sprintf("%s is an agent's configuration (keys %s): run it with keyway agent -c %s, check it with keyway validate -c %s; read as a proxy's configuration:",
			file, strings.Join(agentKeys, ", "), file, file), true}
	case config.KindMixed:
		return hintError{err, fmt.Sprintf("%s mixes keys of the agent's configuration (%s) with the proxy's (%s): the proxy and the agent read separate files; check an agent's file with keyway agent --check -c FILE",
			file, strings.Join(agentKeys, ", "), strings.Join(proxyKeys, ", ")), false}
	}
	return err
}

// agentFileHint adds to a problem loading file as the agent's
// configuration what to do when it is (or has keys of) the proxy's.
func agentFileHint(err error, file string) error {
	if _, ok := errors.AsType[*config.Error](err); !ok || file == "" {
		return err
	}
	switch kind, agentKeys, proxyKeys := fileKind(file); kind {
	case config.KindProxy:
		return hintError{err, fmt.Sprintf("%s is a proxy's configuration (keys %s): run it with keyway proxy -c %s, check it with keyway validate -c %s; read as an agent's configuration:",
			file, strings.Join(proxyKeys, ", "), file, file), true}
	case config.KindMixed:
		return hintError{err, fmt.Sprintf("%s mixes keys of the proxy's configuration (%s) with the agent's (%s): the proxy and the agent read separate files",
			file, strings.Join(proxyKeys, ", "), strings.Join(agentKeys, ", ")), false}
	}
	return err
}

// validateAgentFile is keyway validate given an agent's file: it checks
// it as keyway agent --check -c FILE does (with the KEYWAY_AGENT_*
// environment), and says so.
func validateAgentFile(cf *config.ProxyFlags, agentKeys []string, stdout io.Writer) error {
	if len(cf.Options()) > 0 {
		return usageError{fmt.Sprintf("%s is an agent's configuration (keys %s), and the flags given are the proxy's: check it with keyway agent --check -c %s and the agent's flags (keyway agent --help)",
			cf.File, strings.Join(agentKeys, ", "), cf.File)}
	}
	cfg, err := config.LoadAgent(cf.File)
	if err != nil {
		return hintError{err, fmt.Sprintf("(%s was checked as an agent's configuration, as keyway agent -c %s reads it, because of its keys %s)",
			cf.File, cf.File, strings.Join(agentKeys, ", ")), false}
	}
	fmt.Fprintf(stdout, "ok: agent file for keyway agent -c %s: %s\n", cf.File, strings.TrimPrefix(config.AgentSummary(cfg), "ok: "))
	return nil
}
