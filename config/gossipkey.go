package config

import (
	"slices"
	"strings"

	"keyway/fleetauth"
	"keyway/membership"
)

// checkGossipKey reports, as problems of file, what membership.New would
// refuse beyond Validate: the key rules of membership.Config.CheckKey (a
// readable key, and no gossip off loopback without one unless
// gossip.insecure), read with env (nil: no environment). Startup,
// "keyway validate" and "keyway agent --check" all load through here, so
// they refuse the same configurations. A key_file problem is the same as
// Validate's, and sortProblems reports it once.
func (d *decoder) checkGossipKey(file string, g membership.Config, env func(string) (string, bool)) {
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	for _, e := range leafErrors(g.CheckKey(env)) {
		msg := e.Error()
		if rest, ok := strings.CutPrefix(msg, "$"+membership.KeyEnv+": "); ok {
			src := "$" + membership.KeyEnv
			if !slices.Contains(d.sources, src) {
				d.sources = append(d.sources, src)
			}
			d.probs = append(d.probs, Problem{File: src, Message: rest})
			continue
		}
		d.validationProblem(file, "gossip."+msg)
	}
}

// checkGossipCredentials reports, as problems of file, what membership.New
// would refuse about the credentials of a node of role (and set, for an
// agent): the credentials file must hold the role's private key, and
// gossip off loopback needs one (membership.Config.CheckCredentials).
func (d *decoder) checkGossipCredentials(file string, g membership.Config, role membership.Role, set string, env func(string) (string, bool)) {
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	if g.CheckKey(env) != nil {
		return // the key comes first: checkGossipKey's problem
	}
	if g.CredentialsFile != "" {
		if _, err := fleetauth.Load(g.CredentialsFile); err != nil {
			return // Validate's problem, reported once
		}
	}
	for _, e := range leafErrors(g.CheckCredentials(role, set)) {
		d.validationProblem(file, "gossip."+e.Error())
	}
}
