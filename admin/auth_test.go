package admin

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// The auth scheme is matched in any case (RFC 9110 section 11.1); the
// token itself exactly.
func TestBearerSchemeAnyCase(t *testing.T) {
	d := &fakeDrainer{}
	base := drainServer(t, Config{Listen: "127.0.0.1:0", Debug: DebugToken}, envWith("s3cret"), d)
	for _, tc := range []struct {
		auth string
		code int
	}{
		{"Bearer s3cret", 202},
		{"bearer s3cret", 202},
		{"BEARER s3cret", 202},
		{"bEaReR   s3cret ", 202},
		{"Bearer S3CRET", 401},
		{"Basic s3cret", 401},
		{"Bearers3cret", 401},
		{"s3cret", 401},
		{"", 401},
	} {
		for _, p := range []struct {
			method, path string
			ok           int
		}{
			{"POST", "/v1/replica_sets/orders/replicas/orders-0/drain", 202},
			{"GET", "/v1/config", 501}, // admin.debug token; no config source
		} {
			req, _ := http.NewRequest(p.method, base+p.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := tc.code
			if want != 401 {
				want = p.ok
			}
			if resp.StatusCode != want {
				t.Errorf("%s %s with Authorization %q: HTTP %d, want %d", p.method, p.path, tc.auth, resp.StatusCode, want)
			}
		}
	}
}

// A 401 says how to send the token over HTTP and with the CLI.
func TestUnauthorizedNamesTheCLIFlag(t *testing.T) {
	base := drainServer(t, Config{Listen: "127.0.0.1:0", Debug: DebugToken}, envWith("s3cret"), &fakeDrainer{})
	for _, path := range []string{"/v1/replica_sets/orders/replicas/orders-0/drain", "/v1/config"} {
		method := "POST"
		if path == "/v1/config" {
			method = "GET"
		}
		req, _ := http.NewRequest(method, base+path, nil)
		req.Header.Set("Authorization", "Bearer wrong")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{"Authorization: Bearer TOKEN", "admin.token_file", "--token-file FILE", TokenEnv} {
			if resp.StatusCode != 401 || !strings.Contains(string(b), want) || resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s %s: %d %s; want 401 with WWW-Authenticate, saying %s", method, path, resp.StatusCode, b, want)
			}
		}
	}
}

// The client turns a 401 into the CLI's advice: the flag, not the header.
func TestClientUnauthorized(t *testing.T) {
	with := drainServer(t, Config{Listen: "127.0.0.1:0"}, envWith("s3cret"), &fakeDrainer{})
	without := drainServer(t, Config{Listen: "127.0.0.1:0"}, noEnv, &fakeDrainer{})
	for _, tc := range []struct {
		base, token string
		want        []string
	}{
		{with, "wrong", []string{"missing or wrong bearer token (HTTP 401)", "the token sent was refused", "with --token-file FILE or set " + TokenEnv}},
		{with, "", []string{"no token was sent", "--token-file FILE"}},
		{without, "s3cret", []string{"no admin token configured on this proxy: set admin.token_file or " + TokenEnv}},
	} {
		c := &Client{Addr: tc.base, Token: tc.token}
		_, _, err := c.Drain("orders", "orders-0", true)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) || strings.Contains(err.Error(), "Authorization:") {
				t.Errorf("token %q: %v; want an error saying %q, without the HTTP-level advice", tc.token, err, w)
			}
		}
		if tc.base == without && strings.Contains(err.Error(), "--token-file") {
			t.Errorf("no token configured on the proxy: %v; a flag cannot fix it", err)
		}
	}
}
