package balancer

import "strings"

// MaxReplicas is the largest replica count a replica set may declare (its
// declared count is 1..MaxReplicas).
const MaxReplicas = 1000

// MaxWeight is the largest weight a replica may have (1..MaxWeight).
const MaxWeight = 1000

// ValidSetName reports whether s may name a replica set: 1 to 63
// lower-case ASCII letters, digits, '-' or '_' (e.g. "orders"). Set names
// appear in metric labels, log fields, error bodies and gossip metadata.
func ValidSetName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// ValidReplicaName reports whether s may name a replica (its ring
// identity): 1 to 128 bytes without spaces, tabs or line breaks (e.g.
// "orders-0").
func ValidReplicaName(s string) bool {
	return s != "" && len(s) <= 128 && !strings.ContainsAny(s, " \t\r\n")
}

// OutReason says why a member is out of rotation: its own state, gossip's
// verdict and this proxy's exclusions, in that order, joined by "; " (e.g.
// "state draining; excluded: probe"), or "out of rotation" when none of
// them applies. It returns "" for a member in rotation.
func (m Member) OutReason() string {
	if m.InRotation {
		return ""
	}
	var why []string
	if m.Slot < 0 {
		why = append(why, "not on the ring (never ready)")
	}
	if m.State != StateReady {
		why = append(why, "state "+m.State.String())
	}
	if m.Down {
		why = append(why, "down (gossip)")
	}
	if m.Excluded != 0 {
		why = append(why, "excluded: "+m.Excluded.String())
	}
	if len(why) == 0 {
		return "out of rotation"
	}
	return strings.Join(why, "; ")
}
