package config

import (
	"slices"
	"strings"

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
