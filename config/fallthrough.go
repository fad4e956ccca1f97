package config

import (
	"fmt"
	"slices"
	"strings"

	"keyway/proxy"
)

// FallThroughs warns, for each replica set of old that next does not
// have, when its requests would go to another set of next (a broader
// match) rather than get 404: a pipeline's data landing in another
// pipeline, unless that is what the operator meant. Sets deleted at run
// time answer 410 instead (proxy.Config.Gone); this is about the file.
func FallThroughs(old, next Config) []string {
	var out []string
	for _, gone := range old.ReplicaSets {
		if slices.ContainsFunc(next.ReplicaSets, func(sc proxy.SetConfig) bool { return sc.Name == gone.Name }) {
			continue
		}
		if to, ok := catcher(gone.Match, next.ReplicaSets); ok {
			out = append(out, fmt.Sprintf("replica set %q is removed: its requests (%s) go to replica set %q from now on, not 404; "+
				"if they should not, keep a set for that route, or delete the set at run time first (keyway delete: 410 Gone)", gone.Name, describeMatch(gone.Match), to))
		}
	}
	return out
}

// catcher names the set of sets that takes every request of match m: the
// most specific one whose host is m's or any and whose path prefix covers
// m's (whole segments), as the proxy matches.
func catcher(m proxy.MatchConfig, sets []proxy.SetConfig) (string, bool) {
	best, bestHost, bestPrefix := "", -1, -1
	for _, sc := range sets {
		h := strings.ToLower(sc.Match.Host)
		if h != "" && h != strings.ToLower(m.Host) || !coversPrefix(m.PathPrefix, sc.Match.PathPrefix) {
			continue
		}
		if len(h) > bestHost || len(h) == bestHost && len(sc.Match.PathPrefix) > bestPrefix {
			best, bestHost, bestPrefix = sc.Name, len(h), len(sc.Match.PathPrefix)
		}
	}
	return best, best != ""
}

// coversPrefix reports whether every path under prefix p matches prefix
// q (whole segments, as the proxy's match: "/orders" covers
// "/orders/x", "/" covers everything).
func coversPrefix(p, q string) bool {
	if !strings.HasPrefix(p, q) {
		return false
	}
	return len(p) == len(q) || strings.HasSuffix(q, "/") || p[len(q)] == '/'
}

func describeMatch(m proxy.MatchConfig) string {
	if m.Host == "" {
		return "path " + m.PathPrefix
	}
	return "host " + m.Host + ", path " + m.PathPrefix
}
