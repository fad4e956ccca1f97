package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"

	"keyway/agent"
	"keyway/config"
)

// A port that another process holds is the operator's configuration to
// change, not a crash: the error names the key, the flag and the
// environment variable that change it, and exits 2 like a configuration
// problem. The components report a failed bind with their own prefixes
// (proxy "listen ADDR: ...", admin "admin listen ADDR: ...", agent "agent
// listen ADDR: ...", gossip "gossip...: ... bind: ..."); memberlist keeps
// only the text of the cause (%v), so gossip is recognised by text, as
// membership itself does when it retries a taken port.

// bindError is a listener, or the gossip port, that could not be opened.
type bindError struct {
	key  string // the configuration key to change, e.g. "gossip.bind_port"
	addr string // the address that failed
	why  string // the cause, explained
	how  string // where to change the key
	err  error
}

func (e *bindError) Error() string {
	return fmt.Sprintf("%s: cannot listen on %s: %s; %s", e.key, e.addr, e.why, e.how)
}

func (e *bindError) Unwrap() error { return e.err }

// listenerKey is how one listener's bind failure reads and where its
// address is configured.
type listenerKey struct {
	prefix   string // the component's error prefix
	key      string // the key of the address (port)
	addrKey  string // the key of the IP when it differs (gossip), for "cannot assign"
	addr     string
	flag     string // e.g. "--listen ADDR"
	addrFlag string
	env      string
	addrEnv  string
	note     string // e.g. "(0 picks a free port)"
}

// proxyListeners are the listeners of keyway proxy (and demo).
func proxyListeners(cfg config.Config) []listenerKey {
	g := cfg.Gossip
	return []listenerKey{
		{prefix: "admin listen ", key: "admin.listen", addr: cfg.Admin.Listen, flag: "--admin-listen ADDR", env: "KEYWAY_ADMIN_LISTEN",
			note: `(the default is 127.0.0.1:9901; "" disables the admin listener)`},
		{prefix: "listen ", key: "listen", addr: cfg.Listen, flag: "--listen ADDR", env: "KEYWAY_LISTEN"},
		{prefix: "gossip", key: "gossip.bind_port", addrKey: "gossip.bind_addr", addr: net.JoinHostPort(g.BindAddr, strconv.Itoa(g.BindPort)),
			flag: "--gossip-bind-port PORT", addrFlag: "--gossip-bind-addr IP", env: "KEYWAY_GOSSIP_BIND_PORT", addrEnv: "KEYWAY_GOSSIP_BIND_ADDR",
			note: "(0 picks a free port)"},
	}
}

// agentListeners are the listeners of keyway agent.
func agentListeners(cfg agent.Config) []listenerKey {
	g := cfg.Gossip
	return []listenerKey{
		{prefix: "agent listen ", key: "listen", addr: cfg.Listen, flag: "--listen ADDR", env: config.AgentEnvName("listen"),
			note: `("" disables the agent's HTTP listener)`},
		{prefix: "gossip", key: "gossip.bind_port", addrKey: "gossip.bind_addr", addr: net.JoinHostPort(g.BindAddr, strconv.Itoa(g.BindPort)),
			flag: "--gossip.bind_port PORT", addrFlag: "--gossip.bind_addr IP", env: config.AgentEnvName("gossip.bind_port"),
			addrEnv: config.AgentEnvName("gossip.bind_addr"), note: "(0 picks a free port)"},
	}
}

// explainBind turns a failed bind of one of the listeners into a
// *bindError; any other error passes unchanged. file is the configuration
// file ("" for none).
func explainBind(err error, file string, listeners []listenerKey) error {
	if err == nil || !isBindFailure(err) {
		return err
	}
	msg := err.Error()
	for _, l := range listeners {
		if !strings.HasPrefix(msg, l.prefix) {
			continue
		}
		key, flag, env, what, note := l.key, l.flag, l.env, "another port", l.note
		why := bindCause(err)
		switch {
		case errors.Is(err, syscall.EADDRNOTAVAIL) || strings.Contains(msg, "cannot assign requested address"):
			what = "an address of this host"
			if l.addrKey != "" {
				key, flag, env, note = l.addrKey, l.addrFlag, l.addrEnv, ""
			}
		case l.addrKey == "" && !strings.Contains(msg, "bind: "):
			what = "another address" // a host name that does not resolve, say
		}
		how := fmt.Sprintf("choose %s: change %s in %s, pass %s or set %s", what, key, file, flag, env)
		if file == "" {
			how = fmt.Sprintf("choose %s: pass %s or set %s (key %s)", what, flag, env, key)
		}
		if note != "" {
			how += " " + note
		}
		return &bindError{key: key, addr: l.addr, why: why, how: how, err: err}
	}
	return err
}

// isBindFailure reports whether err is a listener that could not be
// opened: a net.OpError of op "listen" (proxy, admin, agent), or
// memberlist's text of one (gossip).
func isBindFailure(err error) bool {
	if oe, ok := errors.AsType[*net.OpError](err); ok && oe.Op == "listen" {
		return true
	}
	return strings.Contains(err.Error(), "bind: ")
}

// bindCause explains the operating system's answer.
func bindCause(err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, syscall.EADDRINUSE) || strings.Contains(msg, "address already in use"):
		return "the address is already in use (another process, perhaps another keyway, listens there)"
	case errors.Is(err, syscall.EACCES) || strings.Contains(msg, "permission denied"):
		return "permission denied (ports below 1024 need privileges)"
	case errors.Is(err, syscall.EADDRNOTAVAIL) || strings.Contains(msg, "cannot assign requested address"):
		return "no interface of this host has that IP address"
	}
	if oe, ok := errors.AsType[*net.OpError](err); ok && oe.Err != nil {
		return oe.Err.Error()
	}
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}
