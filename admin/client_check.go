package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
)

// AdminHeader is set ("1") on every answer of the admin listener, errors
// included, so that a client can tell the admin API from any other HTTP
// server at the address it was given: the proxy's own listener (which
// relays whatever a replica answers, or answers its own JSON errors), a
// replica, or something else. An answer without it is never decoded, and
// the Client sends nothing else to an address whose probe (ProbePath)
// lacks it.
const AdminHeader = "X-Keyway-Admin"

// ErrNotAdmin is returned (wrapped) when the address answered HTTP, but
// not as keyway's admin API.
var ErrNotAdmin = errors.New("not the keyway admin API")

// checkAdmin rejects an answer that does not come from the admin API,
// saying what answered instead.
func (c *Client) checkAdmin(method, path string, resp *http.Response, body []byte) error {
	return c.checkAdminSent(method, path, resp, body, "")
}

// checkAdminSent is checkAdmin, with a note on what was (not) sent after
// the answer (", and nothing else was sent to it").
func (c *Client) checkAdminSent(method, path string, resp *http.Response, body []byte, sent string) error {
	if resp.Header.Get(AdminHeader) != "" {
		return nil
	}
	if err := c.plainToTLS(resp, body); err != nil {
		return err
	}
	const fix = "pass the admin address (admin.listen, default 127.0.0.1:9901) with --admin or KEYWAY_ADMIN"
	if proxyAnswer(resp, body) {
		return notAdminError(fmt.Sprintf("%s answered like a keyway proxy listener, not the admin API%s: %s", c.Addr, sent, fix))
	}
	what := fmt.Sprintf("HTTP %d", resp.StatusCode)
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		what += ", " + ct
	}
	if sv := resp.Header.Get("Server"); sv != "" {
		what += ", server " + sv
	}
	return notAdminError(fmt.Sprintf("%s is not a keyway admin API: %s %s answered %s without the %s header%s: %s",
		c.Addr, method, path, what, AdminHeader, sent, fix))
}

// notAdminError is ErrNotAdmin with what answered instead.
type notAdminError string

func (e notAdminError) Error() string { return string(e) }

func (e notAdminError) Is(target error) bool { return target == ErrNotAdmin }

// proxyAnswer reports whether an answer is one of the keyway proxy
// listener's own JSON errors: {"error", "replica_set", "replica"}.
func proxyAnswer(resp *http.Response, body []byte) bool {
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return false
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return false
	}
	_, set := fields["replica_set"]
	_, msg := fields["error"]
	return set && msg
}
