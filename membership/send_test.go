package membership_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/membership"
)

// A message too large for one packet goes over TCP with SendReliable and
// arrives whole; Send and SendReliable refuse a member that is not alive.
func TestSendReliable(t *testing.T) {
	var mu sync.Mutex
	var got []string
	recv, err := membership.New(testConfig(), membership.Meta{Role: membership.RoleProxy, Addr: "a"}, membership.Options{
		Logger: testLogger(t).Named("a"),
	})
	if err != nil {
		t.Fatal(err)
	}
	recv.Handle("big", membership.RoleProxy, func(m membership.Message) {
		mu.Lock()
		got = append(got, m.From+":"+string(m.Body))
		mu.Unlock()
	})
	runNode(t, recv)
	cfg := testConfig()
	cfg.Join = []string{recv.GossipAddr()}
	send, err := membership.New(cfg, membership.Meta{Role: membership.RoleProxy, Addr: "b"}, membership.Options{Logger: testLogger(t).Named("b")})
	if err != nil {
		t.Fatal(err)
	}
	runNode(t, send)
	poll.Until(t, 10*time.Second, "the two nodes to see each other", func() bool {
		for _, m := range send.Members() {
			if m.Node == recv.Name() && m.Status == membership.StatusAlive {
				return true
			}
		}
		return false
	})
	big := `{"kind":"big","pad":"` + strings.Repeat("x", 64<<10) + `"}`
	if err := send.SendReliable(recv.Name(), []byte(big)); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the 64 KiB message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 1 && got[0] == send.Name()+":"+big
	})
	for _, f := range []func(string, []byte) error{send.Send, send.SendReliable} {
		if err := f("nobody", []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "no live member") {
			t.Fatalf("send to an unknown member: %v", err)
		}
	}
}
