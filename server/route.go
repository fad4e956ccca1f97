package server

import (
	"errors"
	"fmt"

	"keyway/admin"
	"keyway/proxy"
)

// Route explains where a key goes, as the proxy decides it: the
// explanation comes from proxy.Explain, which runs the request handler's
// own decision, so that it cannot disagree with the routing.
func (v *view) Route(set, key string) (admin.RouteExplain, error) {
	ex, err := v.n.p.Explain(set, key)
	if errors.Is(err, proxy.ErrUnknownSet) {
		return admin.RouteExplain{}, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	if err != nil {
		return admin.RouteExplain{}, err
	}
	out := admin.RouteExplain{
		Set: ex.Set, Key: ex.Key, Hash: fmt.Sprintf("%016x", ex.Hash), Partition: ex.Partition,
		Failover: ex.Failover.String(), Owner: ex.Owner, Pick: ex.Pick, FailOpen: ex.FailOpen,
		Fingerprint: ex.Fingerprint, Generation: ex.Generation,
		Candidates: make([]admin.RouteCandidate, 0, len(ex.Candidates)),
	}
	if ex.Answer != nil {
		out.AnswerStatus, out.Answer = ex.Answer.Status, ex.Answer.Message
	}
	for _, c := range ex.Candidates {
		out.Candidates = append(out.Candidates, admin.RouteCandidate{
			Name: c.Name, Addr: c.Addr, State: c.State.String(), InRotation: c.InRotation,
			Picked: c.Attempt == 1, Attempt: c.Attempt, Skipped: c.Skipped,
		})
	}
	return out, nil
}
