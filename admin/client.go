package admin

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Client calls one proxy's admin API: the keyway CLI's status, members,
// route, plan, drain, undrain, reload and scale. Every method returns the decoded
// answer and the raw JSON body (for --json), or an error that names the
// address and says what to check. Its first call probes the address
// (ProbePath) and sends nothing else unless the admin API answers. Safe
// for concurrent use.
type Client struct {
	// Addr is the admin API as the user wrote it: host:port or a URL.
	Addr string
	// Token is the bearer token of the mutating calls.
	Token string
	// Timeout bounds one call; 0 means 5 s. Reload uses at least 30 s: it
	// waits for gossip to carry new ring fingerprints.
	Timeout time.Duration
	// Actor names the caller in the audit trail of mutating calls (the
	// X-Keyway-Actor header), e.g. "alice@build-7"; "" sends none.
	Actor string
	// TLS configures calls to an admin listener over TLS (an https:// Addr,
	// or host:port when TLS is set): the CAs that verify its certificate,
	// a client certificate for mTLS. Nil means the system's roots and no
	// client certificate. It must not be changed after the first call.
	TLS *tls.Config

	mu        sync.Mutex
	transport *http.Transport // made at the first call, with TLS

	probeMu sync.Mutex
	probed  bool // the probe (probe.go) found the admin API
}

// ErrBadAddr is returned (wrapped) for an Addr that is not host:port or a
// URL.
var ErrBadAddr = errors.New("bad admin address")

// BaseURL turns Addr into the API's base URL ("http://host:port", or
// "https://host:port" for host:port with TLS set).
func (c *Client) BaseURL() (string, error) {
	a := strings.TrimSpace(c.Addr)
	if a == "" {
		return "", fmt.Errorf("%w: empty: pass the admin API address, e.g. 127.0.0.1:9901", ErrBadAddr)
	}
	if !strings.Contains(a, "://") {
		if c.TLS != nil {
			a = "https://" + a
		} else {
			a = "http://" + a
		}
	}
	u, err := url.Parse(a)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("%w %q: want host:port, http://host:port or https://host:port", ErrBadAddr, c.Addr)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// Sets lists the replica sets (GET /v1/replica_sets).
func (c *Client) Sets() ([]SetStatus, []byte, error) {
	var out SetList
	raw, err := c.get("/v1/replica_sets", &out)
	return out.ReplicaSets, raw, err
}

// Set returns one replica set with its replicas and traffic (GET
// /v1/replica_sets/{set}).
func (c *Client) Set(name string) (SetStatus, []byte, error) {
	var out SetStatus
	raw, err := c.get("/v1/replica_sets/"+url.PathEscape(name), &out)
	return out, raw, err
}

// Members lists the gossip members (GET /v1/members).
func (c *Client) Members() ([]MemberInfo, []byte, error) {
	var out MemberList
	raw, err := c.get("/v1/members", &out)
	return out.Members, raw, err
}

// Fleet reports how the proxies' routing compares (GET /v1/fleet).
func (c *Client) Fleet() (FleetStatus, []byte, error) {
	var out FleetStatus
	raw, err := c.get("/v1/fleet", &out)
	return out, raw, err
}

// Route explains where a key goes (GET /v1/route).
func (c *Client) Route(set, key string) (RouteExplain, []byte, error) {
	var out RouteExplain
	raw, err := c.get("/v1/route?"+url.Values{"set": {set}, "key": {key}}.Encode(), &out)
	return out, raw, err
}

// Plan computes what adding and removing ring members of a set would do
// (GET /v1/replica_sets/{set}/plan); it changes nothing.
func (c *Client) Plan(set string, add, remove []string) (ReplicaSetPlan, []byte, error) {
	var out ReplicaSetPlan
	q := url.Values{"add": add, "remove": remove}.Encode()
	raw, err := c.get("/v1/replica_sets/"+url.PathEscape(set)+"/plan?"+q, &out)
	return out, raw, err
}

// Drain drains (drain true) or undrains a replica (POST
// /v1/replica_sets/{set}/replicas/{replica}/drain|undrain).
func (c *Client) Drain(set, replica string, drain bool) (DrainResult, []byte, error) {
	action := "undrain"
	if drain {
		action = "drain"
	}
	path := "/v1/replica_sets/" + url.PathEscape(set) + "/replicas/" + url.PathEscape(replica) + "/" + action
	var out DrainResult
	raw, err := c.call(http.MethodPost, path, nil, http.StatusAccepted, &out, c.timeout())
	return out, raw, err
}

// Reload makes the proxy re-read its configuration file (POST /v1/reload).
// A refused file is an error listing every problem.
func (c *Client) Reload() (ReloadResult, []byte, error) {
	var out ReloadResult
	raw, err := c.call(http.MethodPost, "/v1/reload", nil, http.StatusOK, &out, max(c.timeout(), 30*time.Second))
	return out, raw, err
}

// Restart starts a rolling restart of a set (POST
// /v1/replica_sets/{set}/restart); stepTimeout 0 means the server's
// default.
func (c *Client) Restart(set string, stepTimeout time.Duration) (RestartStatus, []byte, error) {
	return c.RestartWith(set, RestartOptions{StepTimeout: stepTimeout})
}

// RestartWith is Restart with every option; Force is sent as the body
// {"force": true}. A proxy too old to know it ignores the body: the
// answer's Force is then false.
func (c *Client) RestartWith(set string, opts RestartOptions) (RestartStatus, []byte, error) {
	path := "/v1/replica_sets/" + url.PathEscape(set) + "/restart"
	if opts.StepTimeout > 0 {
		path += "?step_timeout=" + url.QueryEscape(opts.StepTimeout.String())
	}
	var body []byte
	if opts.Force {
		body, _ = json.Marshal(RestartRequest{Force: true})
	}
	var out RestartStatus
	raw, err := c.call(http.MethodPost, path, body, http.StatusAccepted, &out, c.timeout())
	return out, raw, err
}

// AckRestart acknowledges a set's failed rolling restart (POST
// /v1/replica_sets/{set}/restart/ack): the dashboard no longer marks it.
func (c *Client) AckRestart(set string) (RestartStatus, []byte, error) {
	var out RestartStatus
	raw, err := c.call(http.MethodPost, "/v1/replica_sets/"+url.PathEscape(set)+"/restart/ack", nil, http.StatusOK, &out, c.timeout())
	return out, raw, err
}

// RestartStatus returns a set's last rolling restart on the proxy.
func (c *Client) RestartStatus(set string) (RestartStatus, []byte, error) {
	var out RestartStatus
	raw, err := c.get("/v1/replica_sets/"+url.PathEscape(set)+"/restart", &out)
	return out, raw, err
}

// Jobs returns the jobs of a set whose replicas keyway runs.
func (c *Client) Jobs(set string) (JobsStatus, []byte, error) {
	var out JobsStatus
	raw, err := c.get("/v1/replica_sets/"+url.PathEscape(set)+"/jobs", &out)
	return out, raw, err
}

// WaitDrained polls the set until the replica is out of rotation and no
// proxy the asked one hears from has a request in flight to it (true), or
// d passes (false). progress is called with every reading.
func (c *Client) WaitDrained(set, replica string, d time.Duration, progress func(ReplicaStatus)) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		st, _, err := c.Set(set)
		if err != nil {
			return false, err
		}
		i := slices.IndexFunc(st.Replicas, func(r ReplicaStatus) bool { return r.Name == replica })
		if i < 0 {
			return false, fmt.Errorf("replica set %q has no replica %q any more", set, replica)
		}
		r := st.Replicas[i]
		progress(r)
		if !r.InRotation && r.FleetInflight == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		<-time.After(200 * time.Millisecond)
	}
}

// FollowRestart polls a set's running rolling restart, calling each for
// every step not seen before (from the n-th on), until it ends; it returns
// the final status.
func (c *Client) FollowRestart(set string, st RestartStatus, n int, each func(RestartStep)) (RestartStatus, error) {
	for {
		for ; n < len(st.Steps); n++ {
			each(st.Steps[n])
		}
		if st.State != "running" {
			return st, nil
		}
		<-time.After(300 * time.Millisecond)
		var err error
		if st, _, err = c.RestartStatus(set); err != nil {
			return st, err
		}
	}
}

// Repair revives a set (POST /v1/replica_sets/{set}/repair).
func (c *Client) Repair(set string) (RepairResult, []byte, error) {
	var out RepairResult
	raw, err := c.call(http.MethodPost, "/v1/replica_sets/"+url.PathEscape(set)+"/repair", nil, http.StatusAccepted, &out, c.timeout())
	return out, raw, err
}

// Scale changes a set's declared replica count, fleet-wide (PATCH
// /v1/replica_sets/{set} {"replicas": N}), from the version the set has
// now (PatchSet).
func (c *Client) Scale(set string, replicas int) (SetChange, []byte, error) {
	return c.PatchSet(set, SetPatch{Replicas: &replicas})
}

// PatchSet changes a set's declared count and/or stops or starts it,
// fleet-wide (PATCH /v1/replica_sets/{set}). It reads the set first and
// writes with its version as If-Match: a write another caller made in
// between is not overwritten unseen (409).
func (c *Client) PatchSet(set string, p SetPatch) (SetChange, []byte, error) {
	st, raw, err := c.Set(set)
	if err != nil {
		return SetChange{}, raw, err
	}
	var out SetChange
	body, _ := json.Marshal(p)
	raw, err = c.call(http.MethodPatch, "/v1/replica_sets/"+url.PathEscape(set), body, http.StatusOK, &out, c.timeout(), "If-Match", etag(st.Version))
	return out, raw, err
}

// etag is a version as an ETag and If-Match carry it.
func etag(v uint64) string { return `"` + strconv.FormatUint(v, 10) + `"` }

// CreateSet creates a set from spec, a JSON object with the keys of a
// replica_sets entry (POST /v1/replica_sets).
func (c *Client) CreateSet(spec []byte) (SetChange, []byte, error) {
	var out SetChange
	raw, err := c.call(http.MethodPost, "/v1/replica_sets", spec, http.StatusCreated, &out, c.timeout())
	return out, raw, err
}

// DeleteSet deletes a set (DELETE /v1/replica_sets/{set}).
func (c *Client) DeleteSet(set string) (SetChange, []byte, error) {
	st, raw, err := c.Set(set)
	if err != nil {
		return SetChange{}, raw, err
	}
	var out SetChange
	raw, err = c.call(http.MethodDelete, "/v1/replica_sets/"+url.PathEscape(set), nil, http.StatusOK, &out, c.timeout(), "If-Match", etag(st.Version))
	return out, raw, err
}

// ClearRuntime hands a set back to the configuration file (DELETE
// /v1/runtime/{set}).
func (c *Client) ClearRuntime(set string) (SetChange, []byte, error) {
	rt, raw, err := c.Runtime()
	if err != nil {
		return SetChange{}, raw, err
	}
	var hdr []string
	for _, r := range rt.Records {
		if r.Set == set {
			hdr = []string{"If-Match", etag(r.Version)}
		}
	}
	var out SetChange
	raw, err = c.call(http.MethodDelete, "/v1/runtime/"+url.PathEscape(set), nil, http.StatusOK, &out, c.timeout(), hdr...)
	return out, raw, err
}

// Runtime returns the run-time state (GET /v1/runtime).
func (c *Client) Runtime() (RuntimeStatus, []byte, error) {
	var out RuntimeStatus
	raw, err := c.get("/v1/runtime", &out)
	return out, raw, err
}

// Export returns the sets the proxy serves as YAML for a configuration
// file (GET /v1/runtime/export).
func (c *Client) Export() ([]byte, error) {
	base, err := c.BaseURL()
	if err != nil {
		return nil, err
	}
	if err := c.probe(); err != nil {
		return nil, err
	}
	resp, err := c.httpClient(c.timeout()).Get(base + "/v1/runtime/export")
	if err != nil {
		return nil, c.reachError(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if err := c.checkAdmin(http.MethodGet, "/v1/runtime/export", resp, raw); err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, c.apiError(http.MethodGet, "/v1/runtime/export", resp.StatusCode, raw)
	}
	return raw, nil
}

func (c *Client) timeout() time.Duration {
	if c.Timeout <= 0 {
		return 5 * time.Second
	}
	return c.Timeout
}

func (c *Client) get(path string, v any) ([]byte, error) {
	return c.call(http.MethodGet, path, nil, http.StatusOK, v, c.timeout())
}

// call sends one request and decodes a `want` answer into v; hdr are
// more headers, name and value in turn. The first call of a client probes
// the address first (probe.go): nothing else, a token least of all, goes
// to an address that is not the admin API.
func (c *Client) call(method, path string, body []byte, want int, v any, timeout time.Duration, hdr ...string) ([]byte, error) {
	base, err := c.BaseURL()
	if err != nil {
		return nil, err
	}
	if err := c.probe(); err != nil {
		return nil, err
	}
	req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if method != http.MethodGet {
		req.Header.Set("Authorization", "Bearer "+c.Token)
		if c.Actor != "" {
			req.Header.Set(ActorHeader, c.Actor)
		}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.httpClient(timeout).Do(req)
	if err != nil {
		return nil, c.reachError(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s%s: %w", base, path, err)
	}
	if err := c.checkAdmin(method, path, resp, raw); err != nil {
		return raw, err
	}
	if resp.StatusCode != want {
		return raw, c.apiError(method, path, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return raw, fmt.Errorf("admin API at %s: %s %s: not a keyway answer: %v", c.Addr, method, path, err)
	}
	return raw, nil
}

// httpClient returns a client for one call bounded by timeout. Calls
// share one transport (and its connections: one TLS handshake for the
// several calls of a command).
func (c *Client) httpClient(timeout time.Duration) *http.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		if c.TLS != nil {
			t.TLSClientConfig = c.TLS.Clone()
		}
		c.transport = t
	}
	// A redirect is answered, not followed: the admin API sends none, and
	// a token must not follow one elsewhere.
	return &http.Client{Timeout: timeout, Transport: c.transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// reachError explains a call that got no answer, with what to check:
// the address, or for TLS the CA, the name, the client certificate.
func (c *Client) reachError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	hint := "is the proxy running with admin.listen there? pass --admin ADDR or set KEYWAY_ADMIN"
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var record tls.RecordHeaderError
	var oe *net.OpError
	switch {
	case errors.As(err, &unknown):
		hint = "certificate signed by unknown authority: pass --ca-file FILE (or set KEYWAY_ADMIN_CA) naming the CA that signed the admin listener's certificate"
	case errors.As(err, &host):
		hint = "the admin listener's certificate is not issued for the host in --admin: use a name or address it covers"
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		hint = "the admin listener's certificate expired or is not valid yet: renew it"
	case errors.As(err, &record), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		hint = "the admin listener does not speak TLS: use --admin http://HOST:PORT"
	case errors.As(err, &oe) && oe.Op == "remote error", strings.Contains(err.Error(), "remote error: tls:"):
		hint = "the admin listener refused the TLS handshake: if it requires a client certificate, pass --cert-file and --key-file (or set KEYWAY_ADMIN_CERT and KEYWAY_ADMIN_KEY) with one its CA trusts"
	}
	return fmt.Errorf("cannot reach the keyway admin API at %s: %v\n(%s)", c.Addr, err, hint)
}

// plainToTLS explains the answer of a TLS listener to a plain HTTP
// request (Go's servers answer 400 "Client sent an HTTP request to an
// HTTPS server"), or returns nil.
func (c *Client) plainToTLS(resp *http.Response, body []byte) error {
	if resp.StatusCode != http.StatusBadRequest || !bytes.Contains(body, []byte("HTTP request to an HTTPS server")) {
		return nil
	}
	return fmt.Errorf("admin API at %s: the admin listener uses TLS: use --admin https://HOST:PORT, with --ca-file FILE if its certificate is not signed by a CA this system trusts", c.Addr)
}

// APIError is an error answer of the admin API, as the Client returns
// it: the message and the parts a caller may reword for its own users
// (the CLI names its flags and files where the API names its query
// parameters and the request body).
type APIError struct {
	Addr   string // the admin API, as Client.Addr
	Status int    // the HTTP status
	// Message is the answer's error, Problems the answer's list of
	// problems (a refused definition or reload), if any.
	Message  string
	Problems []string
	// Param, Value and Problem name the query parameter refused, the
	// value given and what is wrong with it (a plan, PlanRefused); Param
	// is "" otherwise.
	Param, Value, Problem string
}

// Error is the message; with problems (400 or 422) the message then one
// problem a line, or the message alone when it names each problem
// already (a refused delete names the replicas in both).
func (e *APIError) Error() string {
	if (e.Status == http.StatusUnprocessableEntity || e.Status == http.StatusBadRequest) && len(e.Problems) > 0 {
		if slices.ContainsFunc(e.Problems, func(p string) bool { return !strings.Contains(e.Message, p) }) {
			return fmt.Sprintf("%s:\n  %s", e.Message, strings.Join(e.Problems, "\n  "))
		}
	}
	return fmt.Sprintf("admin API at %s: %s (HTTP %d)", e.Addr, e.Message, e.Status)
}

// apiError turns an error answer into an error naming the address: an
// *APIError, or for a 401 the flags that send the token.
func (c *Client) apiError(method, path string, status int, body []byte) error {
	var e struct { // ErrorBody, with the fields of ReloadRefused and PlanRefused
		Error    string   `json:"error"`
		Problems []string `json:"problems"`
		Param    string   `json:"param"`
		Value    string   `json:"value"`
		Problem  string   `json:"problem"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		if status == http.StatusUnauthorized {
			return c.unauthorized(e.Error)
		}
		return &APIError{Addr: c.Addr, Status: status, Message: e.Error, Problems: e.Problems,
			Param: e.Param, Value: e.Value, Problem: e.Problem}
	}
	if method == http.MethodGet {
		return fmt.Errorf("admin API at %s: GET %s answered HTTP %d; is %s a keyway admin listener? (--admin, KEYWAY_ADMIN)", c.Addr, path, status, c.Addr)
	}
	return fmt.Errorf("admin API at %s: %s %s answered HTTP %d", c.Addr, method, path, status)
}

// unauthorized explains a 401 to a CLI user: msg is the API's error
// without its HTTP-level advice, followed by the flag that sends the
// token.
func (c *Client) unauthorized(msg string) error {
	msg, _, _ = strings.Cut(msg, ": send Authorization:")
	if strings.HasPrefix(msg, "no admin token configured") {
		return fmt.Errorf("admin API at %s: %s (HTTP 401)", c.Addr, msg)
	}
	sent := "no token was sent"
	if c.Token != "" {
		sent = "the token sent was refused"
	}
	return fmt.Errorf("admin API at %s: %s (HTTP 401)\n(%s: pass the proxy's admin token, the one its admin.token_file holds, with --token-file FILE or set %s)",
		c.Addr, msg, sent, TokenEnv)
}
