package integration

import (
	"encoding/base64"
	"os"
	"testing"
	"time"

	"keyway/admin"
	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
	"keyway/membership"
)

// A fleet with a gossip key (real processes: a proxy, three replicas with
// agents) and a stranger: an agent without the key, on the same loopback,
// claiming orders-1 with its own replica's address. It never joins, it
// never gets a key of orders-1, and the proxy counts its attempts.
func TestStrangerWithoutTheKeyNeverJoins(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	t.Setenv(membership.KeyEnv, base64.StdEncoding.EncodeToString([]byte("keyway-integration-gossip-key-32")))
	px, _ := cluster(t, 3)
	keys := Keys(300)
	c := NewClient()
	before := c.Owners(t, px.Addr, keys, 4)

	// The stranger's processes inherit no key.
	if err := os.Unsetenv(membership.KeyEnv); err != nil {
		t.Fatal(err)
	}
	impostor, addr := StartReplicaProcess(t, "impostor")
	defer impostor.Kill(t)
	stranger := StartAgent(t, "orders-1", addr, []string{px.Gossip})
	defer stranger.Kill(t)

	// Nothing may happen: watch several gossip and push/pull rounds.
	if poll.Within(5*time.Second, func() bool {
		var ms admin.MemberList
		stacktest.GetJSON(t, "http://"+px.Admin+"/v1/members", &ms)
		return len(ms.Members) != 4
	}) {
		t.Fatalf("the proxy's members changed while a stranger without the key tried to join: %s", stacktest.Get("http://"+px.Admin+"/v1/members"))
	}
	poll.Until(t, 10*time.Second, "the proxy to count the stranger's packets", func() bool {
		return Metric(px.Admin, "keyway_gossip_rejected_total", map[string]string{"reason": "decrypt"}) > 0
	})
	after := c.Owners(t, px.Addr, keys, 4)
	for _, k := range keys {
		if after[k] != before[k] {
			t.Fatalf("key %s went to %s, before to %s: the stranger moved keys", k, after[k], before[k])
		}
	}
	if n := len(Stats(t, addr)); n != 0 {
		t.Fatalf("the impostor replica received %d keys", n)
	}
	t.Logf("rejected by the proxy: %v packets or streams", Metric(px.Admin, "keyway_gossip_rejected_total", map[string]string{"reason": "decrypt"}))
}
