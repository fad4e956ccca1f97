package fleetauth

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestKeysRoundTripAndErrors(t *testing.T) {
	pub, priv := NewKey()
	p2, err := ParsePublic(FormatPublic(pub))
	if err != nil || !p2.Equal(pub) {
		t.Fatalf("public key round trip: %v", err)
	}
	k2, err := ParsePrivate(FormatPrivate(priv))
	if err != nil || !k2.Equal(priv) {
		t.Fatalf("private key round trip: %v", err)
	}
	for _, tc := range []struct {
		in, want string
		private  bool
	}{
		{FormatPrivate(priv), "is a private key where a public one belongs", false},
		{FormatPublic(pub), "is a public key where a private one belongs", true},
		{"ed25519-pub:AAAA", "is not 32 bytes of base64", false},
		{"ssh-ed25519 AAAA", `does not start with "ed25519-pub:"`, false},
		{"ed25519-seed:!!", "is not 32 bytes of base64", true},
	} {
		var err error
		if tc.private {
			_, err = ParsePrivate(tc.in)
		} else {
			_, err = ParsePublic(tc.in)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parse %q: %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestCredentialsFileAndRoles(t *testing.T) {
	c := Generate([]string{"orders", "users"})
	for _, tc := range []struct {
		name    string
		creds   Credentials
		as      As
		wantErr string
		signer  Signer
	}{
		{"proxy", c.ForProxy(), As{Role: RoleProxy}, "", Signer{Role: RoleProxy}},
		{"orders agent", c.ForAgent("orders"), As{Role: RoleAgent, Set: "orders"}, "", Signer{Role: RoleAgent, Set: "orders"}},
		{"an agent's file on a proxy", c.ForAgent("orders"), As{Role: RoleProxy}, "proxy.private: no private key", Signer{}},
		{"another set's file", c.ForAgent("orders"), As{Role: RoleAgent, Set: "users"}, "agents.users.private: no private key", Signer{}},
		{"a set without keys", c.ForProxy(), As{Role: RoleAgent, Set: "billing"}, `agents: no keys for set "billing"`, Signer{}},
		{"verify only", c.Public(), As{}, "", Signer{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parsed, err := Parse(tc.creds.Marshal("test\n\nfile"))
			if err != nil {
				t.Fatal(err)
			}
			k, err := parsed.Keyring(tc.as)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Keyring: %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := k.Self(); s.Role != tc.signer.Role || s.Set != tc.signer.Set {
				t.Fatalf("signs as %v, want %v", s, tc.signer)
			}
			if !k.HasSet("orders") || !k.HasSet("users") || k.HasSet("billing") {
				t.Fatalf("sets %v", k.Sets())
			}
		})
	}
	// An agent's file holds no other private key.
	a := c.ForAgent("orders")
	if len(a.Proxy.Private) != 0 || len(a.Agents["users"].Private) != 0 || len(a.Agents["orders"].Private) != 1 {
		t.Fatalf("agent credentials hold %d proxy and %d users private keys", len(a.Proxy.Private), len(a.Agents["users"].Private))
	}
	if p := c.ForProxy(); len(p.Agents["orders"].Private) != 0 || len(p.Proxy.Private) != 1 {
		t.Fatal("proxy credentials hold an agent private key")
	}
	// Errors name the field.
	if _, err := Parse([]byte("proxy: {public: [nope]}\n")); err == nil || !strings.Contains(err.Error(), "proxy.public[0]: does not start with") {
		t.Fatalf("bad key: %v", err)
	}
	if _, err := Parse([]byte("proxy: {public: []}\nagent: {}\n")); err == nil || !strings.Contains(err.Error(), "not a keyway credentials file") {
		t.Fatalf("unknown field: %v", err)
	}
	// One key listed for two roles is refused.
	dup := c.ForProxy()
	dup.Agents["orders"] = KeyList{Public: dup.Proxy.Public}
	if _, err := dup.Keyring(As{Role: RoleProxy}); err == nil || !strings.Contains(err.Error(), "give every role its own keys") {
		t.Fatalf("a key of two roles: %v", err)
	}
	// The first private key must have its public half listed.
	bad := c.ForProxy()
	bad.Proxy.Public = bad.Proxy.Public[:0]
	bad.Proxy.Public = append(bad.Proxy.Public, c.Agents["users"].Public...)
	bad.Agents = nil
	if _, err := bad.Keyring(As{Role: RoleProxy}); err == nil || !strings.Contains(err.Error(), "has no public half") {
		t.Fatalf("unlisted signing key: %v", err)
	}
}

// Rotation: a keyring verifies every listed key and signs with the first.
func TestRotation(t *testing.T) {
	old := Generate(nil)
	next := Generate(nil)
	// Stage 1: the new public key is listed everywhere; the old one signs.
	stage1 := Credentials{Proxy: KeyList{Public: append(old.Proxy.Public, next.Proxy.Public...), Private: old.Proxy.Private}}
	// Stage 2: the new private key signs; both verify.
	stage2 := Credentials{Proxy: KeyList{Public: stage1.Proxy.Public, Private: append(next.Proxy.Private, old.Proxy.Private...)}}
	k1, err := stage1.Keyring(As{Role: RoleProxy})
	if err != nil {
		t.Fatal(err)
	}
	k2, err := stage2.Keyring(As{Role: RoleProxy})
	if err != nil {
		t.Fatal(err)
	}
	oldOnly, _ := old.Keyring(As{Role: RoleProxy})
	id1, sig1, _ := k1.Sign(DomainMessage, []byte("x"))
	id2, sig2, _ := k2.Sign(DomainMessage, []byte("x"))
	if id1 == id2 {
		t.Fatal("stage 2 signs with the old key")
	}
	for _, k := range []*Keyring{k1, k2} {
		for _, s := range []struct {
			id  string
			sig []byte
		}{{id1, sig1}, {id2, sig2}} {
			if _, err := k.Verify(s.id, s.sig, DomainMessage, []byte("x")); err != nil {
				t.Fatalf("a rotating keyring refuses key %s: %v", s.id, err)
			}
		}
	}
	// A member not yet at stage 1 does not know the new key: that is why
	// stage 1 goes everywhere before stage 2.
	if _, err := oldOnly.Verify(id2, sig2, DomainMessage, []byte("x")); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("old keyring on a new signature: %v", err)
	}
	// A signature over other bytes, or in another domain, does not verify.
	if _, err := k1.Verify(id1, sig1, DomainMessage, []byte("y")); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("other bytes: %v", err)
	}
	if _, err := k1.Verify(id1, sig1, DomainMeta, []byte("x")); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("other domain: %v", err)
	}
	// Parts are length-prefixed: ("ab","c") is not ("a","bc").
	_, s, _ := k1.Sign(DomainMessage, []byte("ab"), []byte("c"))
	if _, err := k1.Verify(id1, s, DomainMessage, []byte("a"), []byte("bc")); err == nil {
		t.Fatal("parts are not framed")
	}
}

func TestSignedMessages(t *testing.T) {
	c := Generate([]string{"orders"})
	proxy, _ := c.ForProxy().Keyring(As{Role: RoleProxy})
	agent, _ := c.ForAgent("orders").Keyring(As{Role: RoleAgent, Set: "orders"})
	verifier, _ := c.Public().Keyring(As{})
	body := []byte(`{"kind":"set_stop","set":"orders","note":"\"auth\":\"x\"}","stop":true}`)
	msg, ok := proxy.SignMessage("proxy-a.1", "orders-0.2", 1700000000000000, body)
	if !ok || !bytes.HasPrefix(msg, body[:len(body)-1]) || !bytes.HasSuffix(msg, []byte(`"}`)) {
		t.Fatalf("signed: %s", msg)
	}
	got, a, signed, err := SplitMessage(msg)
	if err != nil || !signed || !bytes.Equal(got, body) || a.Stamp != 1700000000000000 {
		t.Fatalf("split: %s %+v %v %v", got, a, signed, err)
	}
	if s, err := verifier.VerifyMessage("proxy-a.1", "orders-0.2", got, a); err != nil || s.Role != RoleProxy {
		t.Fatalf("verify: %v %v", s, err)
	}
	// Another sender, another receiver or another body: refused.
	for _, tc := range [][3]string{{"proxy-b.1", "orders-0.2", string(body)}, {"proxy-a.1", "orders-1.2", string(body)},
		{"proxy-a.1", "orders-0.2", strings.Replace(string(body), "true", "false", 1)}} {
		if _, err := verifier.VerifyMessage(tc[0], tc[1], []byte(tc[2]), a); !errors.Is(err, ErrBadSignature) {
			t.Errorf("verify %v: %v", tc, err)
		}
	}
	// An agent's message says so.
	am, _ := agent.SignMessage("orders-0.2", "proxy-a.1", 5, []byte(`{}`))
	if string(am[:9]) != `{"auth":"` {
		t.Fatalf("empty object signed as %s", am)
	}
	b, a2, _, _ := SplitMessage(am)
	if s, err := verifier.VerifyMessage("orders-0.2", "proxy-a.1", b, a2); err != nil || s.Role != RoleAgent || s.Set != "orders" {
		t.Fatalf("agent message: %v %v", s, err)
	}
	// Unsigned messages pass through; a malformed signature is an error.
	for _, m := range []string{`{"kind":"x"}`, `{"kind":"x","auth":"not base64!"}`, `[1]`, ``} {
		if got, _, signed, err := SplitMessage([]byte(m)); signed || err != nil || string(got) != m {
			t.Errorf("unsigned %q: %q %v %v", m, got, signed, err)
		}
	}
	if _, _, signed, err := SplitMessage([]byte(`{"kind":"x","auth":"abc.1.AAAA"}`)); !signed || !errors.Is(err, ErrMalformedAuth) {
		t.Errorf("short key id: %v %v", signed, err)
	}
	// A keyring without a private key signs nothing.
	if out, ok := verifier.SignMessage("a", "b", 1, body); ok || !bytes.Equal(out, body) {
		t.Fatal("a verify-only keyring signed")
	}
}

// The cost of one signed gossip message: signing it (each send) and
// splitting and verifying it (each receipt).
func BenchmarkSignMessage(b *testing.B) {
	k, _ := Generate(nil).Keyring(As{Role: RoleProxy})
	body := []byte(`{"kind":"set_stop","set":"orders","stop":true,"version":123456789012345678,"by":"proxy-a:8080"}`)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k.SignMessage("proxy-a.1", "orders-0.2", int64(i), body)
	}
}

func BenchmarkVerifyMessage(b *testing.B) {
	c := Generate(nil)
	k, _ := c.Keyring(As{Role: RoleProxy})
	body := []byte(`{"kind":"set_stop","set":"orders","stop":true,"version":123456789012345678,"by":"proxy-a:8080"}`)
	msg, _ := k.SignMessage("proxy-a.1", "orders-0.2", 1, body)
	b.ReportAllocs()
	for b.Loop() {
		got, a, _, _ := SplitMessage(msg)
		if _, err := k.VerifyMessage("proxy-a.1", "orders-0.2", got, a); err != nil {
			b.Fatal(err)
		}
	}
}
