package membership_test

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"keyway/internal/poll"
	"keyway/membership"
)

// rejected reads keyway_gossip_rejected_total{reason} from reg.
func rejected(t *testing.T, reg prometheus.Gatherer, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "keyway_gossip_rejected_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reason" && lp.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no keyway_gossip_rejected_total{reason=%q}", reason)
	return 0
}

// A stranger that lacks the cluster's key (none, or another one) or label
// never joins: for a few gossip rounds it appears in no keyed node's
// member list and sees none of them, while the keyed node it knocks on
// counts and logs what it rejects.
func TestStrangerNeverJoinsAndIsCounted(t *testing.T) {
	key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	wrong := base64.StdEncoding.EncodeToString([]byte("fedcba9876543210fedcba9876543210"))
	env := map[string]string{membership.KeyEnv: key}

	reg := prometheus.NewPedanticRegistry()
	obs, logs := observer.New(zapcore.WarnLevel)
	log := testLogger(t).WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, obs) }))
	seed, err := membership.New(testConfig(), replicaMeta("r0"), membership.Options{
		Logger: log.Named("r0"), Registerer: reg, Sink: newRecorder(),
		Env: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- seed.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-seed.Started()
	cfg := testConfig()
	cfg.Join = []string{seed.GossipAddr()}
	friend := startNode(t, cfg, replicaMeta("r1"), env)
	keyed := []interface{ Members() []membership.Member }{seed, friend}
	poll.Until(t, 10*time.Second, "the keyed nodes to see each other", func() bool {
		return len(alive(seed.Members())) == 2 && len(alive(friend.Members())) == 2
	})

	cases := []struct {
		name, label, reason string
		env                 map[string]string
	}{
		{"no key", "keyway", "decrypt", nil},
		{"wrong key", "keyway", "decrypt", map[string]string{membership.KeyEnv: wrong}},
		{"other label", "other", "label", env},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := rejected(t, reg, tc.reason)
			cfg := testConfig()
			cfg.Label = tc.label
			cfg.Join = []string{seed.GossipAddr()}
			cfg.RejoinInterval = 0 // it still retries a failed join, with backoff
			stranger := startNode(t, cfg, replicaMeta("stranger"), tc.env)
			defer stranger.stop()
			// The assertion is that nothing happens: watch a few gossip
			// rounds (the fast profile gossips every 100ms, probes every
			// 500ms; push/pull every 2s) for the stranger to get in.
			if poll.Within(2500*time.Millisecond, func() bool {
				for _, n := range keyed {
					if _, in := alive(n.Members())["stranger"]; in {
						return true
					}
				}
				return len(alive(stranger.Members())) > 1
			}) {
				t.Fatalf("the stranger got in: seed sees %v, friend sees %v, the stranger sees %v",
					seed.Members(), friend.Members(), stranger.Members())
			}
			poll.Until(t, 10*time.Second, "the seed to count the stranger's attempts as "+tc.reason, func() bool {
				return rejected(t, reg, tc.reason) > before
			})
		})
	}
	if n := logs.FilterMessageSnippet("gossip rejected").FilterField(zap.String("reason", "decrypt")).Filter(func(e observer.LoggedEntry) bool {
		r, _ := e.ContextMap()["remote"].(string)
		return strings.HasPrefix(r, "127.0.0.1:")
	}).Len(); n == 0 {
		t.Errorf("the seed logged no decrypt rejection naming the stranger's address; warnings: %v", logs.AllUntimed())
	}
}
