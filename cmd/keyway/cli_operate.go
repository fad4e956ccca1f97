package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"keyway/admin"
)

// keyway reload and keyway scale: clients of POST /v1/reload and PATCH
// /v1/replica_sets/{set}, with the bearer token like drain.

// cliToken reads the admin token: --token-file, else KEYWAY_ADMIN_TOKEN.
func cliToken(tokenFile, command string) (string, error) {
	token := strings.TrimSpace(os.Getenv(admin.TokenEnv))
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return "", usageError{fmt.Sprintf("--token-file: %v", err)}
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		return "", usageError{fmt.Sprintf("keyway %s needs the admin token: pass --token-file FILE or set %s", command, admin.TokenEnv)}
	}
	return token, nil
}

// mutate sends an authorized request to the admin API and returns the
// answer's status and body; a transport failure is an error naming the
// address.
func (cf *cliFlags) mutate(method, path, token string, body []byte, timeout time.Duration) (int, []byte, error) {
	base, err := cf.baseURL()
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("cannot reach the keyway admin API at %s: %v\n(is the proxy running with admin.listen there? pass --admin ADDR or set KEYWAY_ADMIN)", cf.admin, unwrapURLError(err))
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, nil
}

// apiError turns an error answer into an error naming the address.
func (cf *cliFlags) apiError(method, path string, status int, body []byte) error {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return fmt.Errorf("admin API at %s: %s (HTTP %d)", cf.admin, e.Error, status)
	}
	return fmt.Errorf("admin API at %s: %s %s answered HTTP %d", cf.admin, method, path, status)
}

const reloadUsage = `Usage: keyway reload [--admin ADDR] [--token-file FILE] [--json]

Asks a running proxy to read its configuration file again (the same as
sending it SIGHUP) and prints what changed. Replica sets, log.level and
admin.token_file change at run time; any other key changed in the file
refuses the whole reload: the proxy keeps its running configuration and
this command prints every problem and exits 1.

`

func runReload(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reload", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var tokenFile string
	fs.StringVar(&tokenFile, "token-file", "", "`FILE` holding the admin bearer token; default env "+admin.TokenEnv)
	if err := parseCLIFlags(fs, args, stderr, reloadUsage); err != nil {
		return err
	}
	token, err := cliToken(tokenFile, "reload")
	if err != nil {
		return err
	}
	// A reload waits for gossip to carry new ring fingerprints (up to 2s)
	// on top of reading and applying the file.
	status, body, err := cf.mutate(http.MethodPost, "/v1/reload", token, nil, 30*time.Second)
	if err != nil {
		return err
	}
	if cf.rawJSON && (status == http.StatusOK || status == http.StatusUnprocessableEntity) {
		if _, err := stdout.Write(body); err != nil {
			return err
		}
	}
	switch status {
	case http.StatusOK:
	case http.StatusUnprocessableEntity:
		var e struct {
			Error    string   `json:"error"`
			Problems []string `json:"problems"`
		}
		if err := json.Unmarshal(body, &e); err != nil {
			return cf.apiError(http.MethodPost, "/v1/reload", status, body)
		}
		return fmt.Errorf("%s:\n  %s", e.Error, strings.Join(e.Problems, "\n  "))
	default:
		return cf.apiError(http.MethodPost, "/v1/reload", status, body)
	}
	if cf.rawJSON {
		return nil
	}
	var res admin.ReloadResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("admin API at %s: POST /v1/reload: not a keyway answer: %v", cf.admin, err)
	}
	if len(res.Keys) == 0 {
		fmt.Fprintf(stdout, "reloaded %s: no change\n", res.File)
		return nil
	}
	fmt.Fprintf(stdout, "reloaded %s: %d key%s changed\n", res.File, len(res.Keys), plural(len(res.Keys)))
	for _, l := range []struct {
		what  string
		names []string
	}{{"added sets", res.Added}, {"removed sets", res.Removed}, {"changed sets", res.Changed}, {"keys move in", res.RingChanged}} {
		if len(l.names) > 0 {
			fmt.Fprintf(stdout, "  %-13s %s\n", l.what+":", strings.Join(l.names, ", "))
		}
	}
	for _, k := range res.Keys {
		fmt.Fprintf(stdout, "  %s\n", k)
	}
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

const scaleUsage = `Usage: keyway scale --set SET --replicas N [--admin ADDR] [--token-file FILE] [--json]

Changes a replica set's declared replica count on one running proxy (what
its phase compares the ready replicas with: fewer ready reads Degraded).
It lasts until a reload changes the set's replicas key in the file, or the
proxy restarts: to keep it, change the file too. Run it against each proxy.

`

func runScale(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var set, tokenFile string
	var replicas int
	fs.StringVar(&set, "set", "", "replica `SET`; required")
	fs.IntVar(&replicas, "replicas", 0, "the declared replica `COUNT`, 1..1000; required")
	fs.StringVar(&tokenFile, "token-file", "", "`FILE` holding the admin bearer token; default env "+admin.TokenEnv)
	if err := parseCLIFlags(fs, args, stderr, scaleUsage); err != nil {
		return err
	}
	if set == "" || replicas == 0 {
		return usageError{"keyway scale needs --set and --replicas"}
	}
	token, err := cliToken(tokenFile, "scale")
	if err != nil {
		return err
	}
	path := "/v1/replica_sets/" + url.PathEscape(set)
	status, body, err := cf.mutate(http.MethodPatch, path, token, []byte(`{"replicas": `+strconv.Itoa(replicas)+`}`), cliTimeout)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return cf.apiError(http.MethodPatch, path, status, body)
	}
	if cf.rawJSON {
		_, err := stdout.Write(body)
		return err
	}
	var res admin.ScaleResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("admin API at %s: PATCH %s: not a keyway answer: %v", cf.admin, path, err)
	}
	fmt.Fprintf(stdout, "scale %s: declared %d (was %d), scope %s\n", res.Set, res.Replicas, res.Previous, res.Scope)
	return nil
}
