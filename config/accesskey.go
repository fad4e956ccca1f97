package config

import (
	"slices"
	"strings"

	"keyway/logging"
)

// checkAccessKey reports, as problems of file, what logging.New would
// refuse beyond Validate: log.access.key: hmac without a secret, or with
// one in the environment (env; nil: no environment) that is too short.
// Startup and "keyway validate" both load through here.
func (d *decoder) checkAccessKey(file string, l logging.Config, env func(string) (string, bool)) {
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	for _, e := range leafErrors(l.CheckKeySecret(env)) {
		msg := e.Error()
		if rest, ok := strings.CutPrefix(msg, "$"+logging.KeySecretEnv+": "); ok {
			src := "$" + logging.KeySecretEnv
			if !slices.Contains(d.sources, src) {
				d.sources = append(d.sources, src)
			}
			d.probs = append(d.probs, Problem{File: src, Message: rest})
			continue
		}
		if strings.HasPrefix(msg, "access.key_secret_file: ") {
			continue // Validate reported it
		}
		d.validationProblem(file, "log."+msg)
	}
}
