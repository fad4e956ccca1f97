package admin

import (
	"fmt"
	"io"
	"net/http"
)

// ProbePath is the first request of every Client: a GET without a body,
// a token or an actor, whose answer must carry AdminHeader before the
// client sends anything else. Pointed at the wrong address (a proxy's
// traffic port, which relays to a replica), the client has then sent
// nothing but one harmless GET. The admin API answers it with APIInfo; an
// older admin API answers 404, with AdminHeader too.
const ProbePath = "/v1/"

// APIInfo is the answer of GET /v1/.
type APIInfo struct {
	// API is "keyway admin".
	API string `json:"api"`
	// Docs names the API's reference.
	Docs string `json:"docs"`
}

func (s *Server) apiInfo(w http.ResponseWriter, r *http.Request) {
	s.reply(w, APIInfo{API: "keyway admin", Docs: "docs/admin.md"})
}

// probe makes sure, once per client, that Addr is a keyway admin API; see
// ProbePath. A failed probe is tried again by the next call.
func (c *Client) probe() error {
	c.probeMu.Lock()
	defer c.probeMu.Unlock()
	if c.probed {
		return nil
	}
	base, err := c.BaseURL()
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodGet, base+ProbePath, nil)
	if err != nil {
		return err
	}
	resp, err := c.httpClient(c.timeout()).Do(req)
	if err != nil {
		return c.reachError(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("reading the answer of %s%s: %w", base, ProbePath, err)
	}
	if err := c.checkAdminSent(http.MethodGet, ProbePath, resp, raw, ", and nothing else was sent to it"); err != nil {
		return err
	}
	if resp.StatusCode == http.StatusMisdirectedRequest {
		return c.apiError(http.MethodGet, ProbePath, resp.StatusCode, raw)
	}
	c.probed = true
	return nil
}
