package balancer

import (
	"slices"
	"testing"
	"time"
)

func TestFleetVerdict(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	ring := []string{"r0", "r1", "r2", "r3"}
	vote := func(replica string, ago time.Duration) FleetVote {
		return FleetVote{Replica: replica, Reason: ReasonEjected, Since: now.Add(-ago)}
	}
	rules := FleetRules{SoloVoteMax: 15 * time.Second, MaxShare: 0.5}
	for name, tc := range map[string]struct {
		views []FleetPeer
		rules FleetRules
		want  []string
	}{
		"no votes": {views: []FleetPeer{{ID: "a"}, {ID: "b"}}},
		"one fresh vote is followed": {
			views: []FleetPeer{{ID: "a", Sets: []FleetSet{{Set: "s", Votes: []FleetVote{vote("r1", time.Second)}}}}, {ID: "b"}},
			want:  []string{"r1"},
		},
		"a solo vote lapses after SoloVoteMax": {
			views: []FleetPeer{{ID: "a", Sets: []FleetSet{{Set: "s", Votes: []FleetVote{vote("r1", 20*time.Second)}}}}},
		},
		"two voters have no time bound": {
			views: []FleetPeer{
				{ID: "a", Sets: []FleetSet{{Set: "s", Votes: []FleetVote{vote("r1", time.Minute)}}}},
				{ID: "b", Sets: []FleetSet{{Set: "s", Votes: []FleetVote{vote("r1", 30*time.Second)}}}},
			},
			want: []string{"r1"},
		},
		"a veto keeps a replica in": {
			views: []FleetPeer{
				{ID: "a", Sets: []FleetSet{{Set: "s", Votes: []FleetVote{vote("r1", time.Second), vote("r2", time.Second)}}}},
				{ID: "b", Sets: []FleetSet{{Set: "s", Vetoes: []string{"r1"}}}},
			},
			want: []string{"r2"},
		},
		"votes of another set and of non-members are ignored": {
			views: []FleetPeer{{ID: "a", Sets: []FleetSet{
				{Set: "other", Votes: []FleetVote{vote("r1", time.Second)}},
				{Set: "s", Votes: []FleetVote{vote("gone", time.Second)}},
			}}},
		},
		"an operator drain on one proxy is not a vote": {
			views: []FleetPeer{{ID: "a", Sets: []FleetSet{{Set: "s", Votes: []FleetVote{{Replica: "r1", Reason: ReasonAdmin, Since: now}}}}}},
		},
		"the cap keeps the best-backed, then the oldest": {
			views: []FleetPeer{
				{ID: "a", Sets: []FleetSet{{Set: "s", Votes: []FleetVote{vote("r0", 1*time.Second), vote("r1", 2*time.Second), vote("r2", 3*time.Second)}}}},
				{ID: "b", Sets: []FleetSet{{Set: "s", Votes: []FleetVote{vote("r0", 1*time.Second)}}}},
			},
			want: []string{"r0", "r2"},
		},
		"one voter twice counts once": {
			views: []FleetPeer{
				{ID: "a", Sets: []FleetSet{{Set: "s", Votes: []FleetVote{vote("r1", 20*time.Second), vote("r1", 20*time.Second)}}}},
			},
		},
		"no bound without SoloVoteMax": {
			views: []FleetPeer{{ID: "a", Sets: []FleetSet{{Set: "s", Votes: []FleetVote{vote("r1", time.Hour)}}}}},
			rules: FleetRules{MaxShare: 1},
			want:  []string{"r1"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := rules
			if tc.rules != (FleetRules{}) {
				r = tc.rules
			}
			var got []string
			for _, e := range FleetVerdict("s", ring, tc.views, now, r) {
				got = append(got, e.Replica)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("held out %v, want %v", got, tc.want)
			}
			// The verdict does not depend on the order of the views.
			rev := slices.Clone(tc.views)
			slices.Reverse(rev)
			var again []string
			for _, e := range FleetVerdict("s", ring, rev, now, r) {
				again = append(again, e.Replica)
			}
			if !slices.Equal(got, again) {
				t.Fatalf("reversed views: %v, want %v", again, got)
			}
		})
	}
}

func TestFleetCap(t *testing.T) {
	for _, c := range []struct {
		n     int
		share float64
		want  int
	}{{1, 0.5, 0}, {2, 0.1, 1}, {4, 0.5, 2}, {5, 0.5, 2}, {3, 1, 3}, {3, 0, 3}} {
		if got := fleetCap(c.n, c.share); got != c.want {
			t.Errorf("fleetCap(%d, %v) = %d, want %d", c.n, c.share, got, c.want)
		}
	}
}

// Two routers fed the same replicas in another order, and excluding the
// same replica, publish tables with the same digest; a change of rotation
// or of failover changes it.
func TestTableDigest(t *testing.T) {
	reps := readyReplicas(5)
	a := newTestRouter(t, RouterConfig{}, nil)
	b := newTestRouter(t, RouterConfig{}, nil)
	a.SetReplicas("gossip", reps)
	rev := slices.Clone(reps)
	slices.Reverse(rev)
	b.SetReplicas("gossip", rev)
	a.Flush()
	b.Flush()
	da, db := a.Table().Digest(), b.Table().Digest()
	if len(da) != 16 || da != db {
		t.Fatalf("digests %q and %q, want equal 16-digit ones", da, db)
	}
	a.SetExcluded(reps[2].Name, ReasonEjected, true)
	a.Flush()
	if a.Table().Digest() == db {
		t.Fatal("an exclusion did not change the digest")
	}
	b.SetExcluded(reps[2].Name, ReasonRefused, true)
	b.Flush()
	if a.Table().Digest() != b.Table().Digest() {
		t.Fatal("the same rotation for other reasons gives another digest")
	}
	c := newTestRouter(t, RouterConfig{Failover: FailoverStrict}, nil)
	c.SetReplicas("gossip", reps)
	c.Flush()
	if c.Table().Digest() == da {
		t.Fatal("failover strict has the digest of failover next")
	}
}
