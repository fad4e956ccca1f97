package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"keyway/admin"
)

// The CLI clients of the admin API: keyway status,
// members and route. Each talks to one proxy's admin listener, named by
// --admin or KEYWAY_ADMIN, and prints a compact aligned table (or the raw
// JSON with --json). drain and undrain call the API's mutating endpoints
// with a bearer token.

// defaultAdminAddr is admin.listen's default, and defaultAdminPort its
// port: the port of an --admin that names a host alone.
const (
	defaultAdminAddr = "127.0.0.1:" + defaultAdminPort
	defaultAdminPort = "9901"
)

// cliTimeout bounds one admin API request.
const cliTimeout = 5 * time.Second

// cliFlags are the flags every client command has.
type cliFlags struct {
	admin   string
	rawJSON bool
	tls     adminTLSFlags
}

func newCLIFlags(fs *flag.FlagSet) *cliFlags {
	cf := &cliFlags{}
	def := os.Getenv("KEYWAY_ADMIN")
	if def == "" {
		def = defaultAdminAddr
	}
	fs.StringVar(&cf.admin, "admin", def, "admin API `ADDR` (host:port, a host alone meaning port "+defaultAdminPort+", or an http:// or https:// URL) of the proxy to ask; env KEYWAY_ADMIN")
	fs.BoolVar(&cf.rawJSON, "json", false, "print the API's JSON answer instead of a table")
	cf.tls.register(fs)
	return cf
}

func parseCLIFlags(fs *flag.FlagSet, args []string, stderr io.Writer, usage string) error {
	return parseArgs(fs, args, stderr, func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	})
}

// client returns the admin API client of --admin, with token for the
// mutating commands.
func (cf *cliFlags) client(token string) *admin.Client {
	return &admin.Client{Addr: cf.admin, Token: token, Timeout: cliTimeout, Actor: cliActor(), TLS: cf.tls.cfg}
}

// cliActor names the caller in the proxies' audit trail: USER@HOST, or
// KEYWAY_ACTOR when set (a CI job's name, say).
func cliActor() string {
	if a := strings.TrimSpace(os.Getenv("KEYWAY_ACTOR")); a != "" {
		return a
	}
	u := cmp.Or(os.Getenv("USER"), os.Getenv("LOGNAME"), "unknown")
	h, err := os.Hostname()
	if err != nil || h == "" {
		return u
	}
	return u + "@" + h
}

// checkAddr rejects an --admin that is not an address, and loads the TLS
// flags' files.
func (cf *cliFlags) checkAddr() error {
	if err := cf.tls.load(); err != nil {
		return err
	}
	cf.admin = withAdminPort(cf.admin)
	if _, err := cf.client("").BaseURL(); err != nil {
		return usageError{"--admin: " + err.Error()}
	}
	return nil
}

const statusUsage = `Usage: keyway status [--set SET] [--admin ADDR] [--json]

Prints every replica set one proxy routes (with --set, only that one): its phase, ready/declared replicas
and replicas in rotation, then each replica with its state, whether it is in
rotation (or why not), its share of the ring's partitions, its requests in
flight (this proxy's, and with other proxies "here/fleet"), the requests per
second it answered and its errors per second (5xx answers and failed
exchanges) over the last ~10 s, and its request and error totals. A rate
is "-" until the proxy has two readings of its counters at least 1 s apart:
run status again a second later (or keep the dashboard open). Example:

  keyway status --set orders

`

func runStatus(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	only := fs.String("set", "", "show only the replica `SET`")
	if err := parseCLIFlags(fs, args, stderr, statusUsage); err != nil {
		return err
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	c := cf.client("")
	list, raw, err := c.Sets()
	if err != nil {
		return err
	}
	if *only != "" {
		if list, err = onlySet(list, *only); err != nil {
			return err
		}
	}
	sets := make([]admin.SetStatus, 0, len(list))
	for _, s := range list {
		one, _, err := c.Set(s.Name)
		if err != nil {
			return err
		}
		sets = append(sets, one)
	}
	if cf.rawJSON {
		if len(sets) == 0 {
			_, err := stdout.Write(raw)
			return err
		}
		return writeJSON(stdout, map[string]any{"replica_sets": sets})
	}
	if len(sets) == 0 {
		fmt.Fprintln(stdout, "no replica sets configured")
		return nil
	}
	for i, s := range sets {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		printSet(stdout, s)
	}
	if fl, _, err := c.Fleet(); err == nil && fl.Self != "" {
		if *only != "" {
			fl.Sets = slices.DeleteFunc(fl.Sets, func(s admin.FleetSet) bool { return s.Set != *only })
		}
		fmt.Fprintln(stdout)
		printFleet(stdout, fl)
	}
	return nil
}

// onlySet keeps the set named name of list, or says that this proxy
// routes no such set and names those it routes.
func onlySet(list []admin.SetStatus, name string) ([]admin.SetStatus, error) {
	var known []string
	for _, s := range list {
		if s.Name == name {
			return []admin.SetStatus{s}, nil
		}
		known = append(known, s.Name)
	}
	if len(known) == 0 {
		return nil, fmt.Errorf("--set %s: unknown replica set %q: this proxy routes no replica sets", name, name)
	}
	return nil, fmt.Errorf("--set %s: unknown replica set %q: this proxy routes %s", name, name, strings.Join(known, ", "))
}

// withAdminPort gives an --admin written as a host alone ("localhost",
// "10.0.0.5", "::1") the admin listener's default port, as admin.listen
// has it: a dial to port 80 would reach anything but keyway. A URL keeps
// its scheme's port (http://keyway-admin.example.com behind a reverse
// proxy), and host:port stays as written.
func withAdminPort(addr string) string {
	a := strings.TrimSpace(addr)
	if a == "" || strings.Contains(a, "://") {
		return addr
	}
	if _, _, err := net.SplitHostPort(a); err == nil {
		return addr
	}
	host := strings.TrimSuffix(strings.TrimPrefix(a, "["), "]")
	if strings.ContainsAny(host, "[]/") || (strings.Contains(host, ":") && net.ParseIP(host) == nil) {
		return addr // not a host: BaseURL names the mistake
	}
	return net.JoinHostPort(host, defaultAdminPort)
}

// printFleet prints whether the other proxies route every set like this
// one, and what the fleet holds out on shared evidence.
func printFleet(w io.Writer, fl admin.FleetStatus) {
	share := "on"
	if !fl.Share {
		share = "off"
	}
	fmt.Fprintf(w, "FLEET  this proxy %s, %s, shared evidence %s\n", fl.Self, plural(len(fl.Proxies), "other proxy", "other proxies"), share)
	if fl.Isolated {
		fmt.Fprintf(w, "  ISOLATED since %s: no gossip contact with the other members; routing on the last view and data-path evidence only\n", fl.IsolatedSince.UTC().Format(time.RFC3339))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  SET\tDIGEST\tAGREEMENT\tHELD BY THE FLEET")
	for _, s := range fl.Sets {
		agree := fmt.Sprintf("agrees with all %d", len(s.Peers))
		if len(s.Peers) == 0 {
			agree = "no other proxy serves it"
		}
		var dis []string
		for _, p := range s.Peers {
			if !p.Agrees {
				dis = append(dis, fmt.Sprintf("%s for %.1fs", p.ID, p.DisagreeingSeconds))
			}
		}
		if len(dis) > 0 {
			agree = "DISAGREES with " + strings.Join(dis, ", ")
		}
		var held []string
		for _, h := range s.Held {
			held = append(held, h.Replica+" ("+strings.Join(h.Voters, ",")+")")
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", s.Set, s.Digest, agree, dash(strings.Join(held, ", ")))
	}
	tw.Flush()
}

func printSet(w io.Writer, s admin.SetStatus) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SET\tPHASE\tREADY/DECLARED\tIN ROTATION\tRING\tFAILOVER\tGEN\tREQ/S\tERR/S\tFINGERPRINT")
	var rps, eps *float64
	if s.Traffic != nil {
		rps, eps = s.Traffic.RequestsPerSecond, s.Traffic.ErrorsPerSecond
	}
	fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d\t%d\t%s\t%d\t%s\t%s\t%s\n", s.Name, s.Phase, s.Ready, s.Declared, s.InRotation, s.RingSize, s.Failover, s.Generation,
		fmtRate(rps), fmtRate(eps), s.Fingerprint)
	tw.Flush()
	if s.Traffic != nil && s.Traffic.ShedPerSecond != nil && *s.Traffic.ShedPerSecond > 0 {
		fmt.Fprintf(w, "  SHEDDING: %s requests/s answered 503/429 + Retry-After (overload; keys stay put; %d in all)\n", fmtRate(s.Traffic.ShedPerSecond), s.Traffic.ShedTotal)
	}
	if s.Stopped {
		fmt.Fprintf(w, "  STOPPED: every request gets 503; 'keyway start --set %s' starts it again\n", s.Name)
	}
	if s.Runtime != nil {
		fmt.Fprintf(w, "  run-time state overrides the file (%s): %s by %s via %s, version %d; 'keyway runtime' lists it\n",
			strings.Join(s.Runtime.Overrides, ", "), s.Runtime.Action, s.Runtime.By, s.Runtime.Via, s.Runtime.Version)
	}
	if len(s.Replicas) == 0 {
		fmt.Fprintln(w, "  (no replicas known)")
		return
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  REPLICA\tSTATE\tROTATION\tSHARE\tSLOT\tIN FLIGHT\tREQ/S\tERR/S\tREQUESTS\tERRORS\tADDR\tSOURCE")
	for _, r := range s.Replicas {
		rot := "in"
		if !r.InRotation {
			rot = "out"
			if r.Reason != "" {
				rot += ": " + r.Reason
			}
		}
		state := r.State
		if r.Down {
			state += " (down)"
		}
		slot := "-"
		if r.Slot >= 0 {
			slot = fmt.Sprint(r.Slot)
		}
		rps, eps, reqs, errs := "-", "-", "-", "-"
		if tr := r.Traffic; tr != nil {
			rps, eps = fmtRate(tr.RequestsPerSecond), fmtRate(tr.ErrorsPerSecond)
			reqs, errs = fmt.Sprint(tr.RequestsTotal), fmt.Sprint(tr.ErrorsTotal)
		}
		inflight := fmt.Sprint(r.Inflight)
		if r.FleetProxies > 1 {
			inflight = fmt.Sprintf("%d/%d", r.Inflight, r.FleetInflight) // here / the fleet
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%.1f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, state, rot, 100*r.Share, slot, inflight, rps, eps, reqs, errs, r.Addr, dash(r.Source))
	}
	tw.Flush()
	if s.Traffic != nil && s.Traffic.RequestsPerSecond == nil {
		fmt.Fprintln(w, "  (REQ/S, ERR/S: not measured yet; rates compare two readings of the proxy's counters at least 1s apart: run status again in a second)")
	}
}

// fmtRate prints a per-second rate of the admin API: "-" for null (not
// measured yet), fewer decimals as it grows.
func fmtRate(r *float64) string {
	switch {
	case r == nil:
		return "-"
	case *r == 0:
		return "0"
	case *r < 10:
		return fmt.Sprintf("%.2f", *r)
	case *r < 100:
		return fmt.Sprintf("%.1f", *r)
	}
	return fmt.Sprintf("%.0f", *r)
}

const membersUsage = `Usage: keyway members [--admin ADDR] [--json]

Prints the gossip members one proxy knows, itself included (marked *):
role, gossip status, the replica set, replica and advertised state of
replicas, and their addresses. REFUSED says why a member's claim is not
believed (unsigned, bad_signature, unknown_key, wrong_key: signed with a
key of another role or set, claim_conflict: a second claim to a live
replica name); its role is then unknown.

`

func runMembers(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("members", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	if err := parseCLIFlags(fs, args, stderr, membersUsage); err != nil {
		return err
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	members, raw, err := cf.client("").Members()
	if err != nil {
		return err
	}
	if cf.rawJSON {
		_, err := stdout.Write(raw)
		return err
	}
	if len(members) == 0 {
		fmt.Fprintln(stdout, "no gossip members (gossip is off on this proxy)")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tSTATUS\tSET\tREPLICA\tSTATE\tADDR\tGOSSIP\tSINCE\tREFUSED")
	for _, m := range members {
		node := m.Node
		if m.Self {
			node += " *"
		}
		since := "-"
		if !m.Since.IsZero() {
			since = m.Since.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", node, m.Role, m.Status,
			dash(m.Set), dash(m.Replica), dash(m.State), dash(m.Addr), dash(m.Gossip), since, dash(m.Refused))
	}
	return tw.Flush()
}

const routeUsage = `Usage: keyway route --set SET --key KEY [--admin ADDR] [--json]

Explains where a key goes now, as this proxy decides it: the ring owner of
its partition, the replica a request with that key is sent to (pick) or
keyway's own answer when none may take it, and the failover candidates in
order: the pick, the replicas a retry would go to, and why each one before
them is skipped. KEY is taken as an X-Key header value would carry it.
Example:

  keyway route --set orders --key order-42

`

func runRoute(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("route", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	set := fs.String("set", "", "replica `SET` (required)")
	key := fs.String("key", "", "routing `KEY` (required)")
	if err := parseCLIFlags(fs, args, stderr, routeUsage); err != nil {
		return err
	}
	switch {
	case *set == "":
		return usageError{"missing --set: keyway route --set SET --key KEY"}
	case *key == "":
		return usageError{"missing --key: keyway route --set SET --key KEY"}
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	ex, raw, err := cf.client("").Route(*set, *key)
	if err != nil {
		return err
	}
	if cf.rawJSON {
		_, err := stdout.Write(raw)
		return err
	}
	pick := ex.Pick
	switch {
	case pick == "":
		pick = fmt.Sprintf("(none: keyway answers %d: %s)", ex.AnswerStatus, ex.Answer)
	case ex.FailOpen:
		pick += " (fail open: no replica is in rotation; the ring owner takes it anyway)"
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "set:\t%s\n", ex.Set)
	fmt.Fprintf(tw, "key:\t%q\n", ex.Key)
	fmt.Fprintf(tw, "hash:\t%s (partition %d)\n", ex.Hash, ex.Partition)
	fmt.Fprintf(tw, "owner:\t%s\n", dash(ex.Owner))
	fmt.Fprintf(tw, "pick:\t%s\n", pick)
	fmt.Fprintf(tw, "failover:\t%s\n", ex.Failover)
	fmt.Fprintf(tw, "ring:\t%s gen %d\n", ex.Fingerprint, ex.Generation)
	tw.Flush()
	if len(ex.Candidates) == 0 {
		fmt.Fprintln(stdout, "\nno candidates: the ring is empty")
		return nil
	}
	fmt.Fprintln(stdout)
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tCANDIDATE\tSTATE\tROTATION\tVERDICT\tADDR")
	for i, c := range ex.Candidates {
		rot := "out"
		if c.InRotation {
			rot = "in"
		}
		verdict := "not considered"
		switch {
		case c.Attempt == 1:
			verdict = "PICKED"
		case c.Attempt > 1:
			verdict = fmt.Sprintf("retry %d", c.Attempt-1)
		case c.Skipped != "":
			verdict = "skipped: " + c.Skipped
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", i+1, c.Name, c.State, rot, verdict, c.Addr)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// runDrain is keyway drain and keyway undrain: POST to the admin API's
// mutating endpoint with the bearer token from --token-file or
// KEYWAY_ADMIN_TOKEN.
func runDrain(args []string, drain bool, stdout, stderr io.Writer) error {
	action := "undrain"
	what := "Ends an operator drain: the replica returns to rotation when its probes pass,\nand this proxy ends any health hold or ejection of it."
	if drain {
		action = "drain"
		what = "Takes a replica out of rotation on every proxy (through its agent, by gossip);\na static replica (no agent) only on the proxy asked. It stays drained until undrain."
	}
	fs := flag.NewFlagSet(action, flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var set, replica, tokenFile string
	fs.StringVar(&set, "set", "", "replica `SET`; required")
	fs.StringVar(&replica, "replica", "", "`REPLICA` name; required")
	fs.StringVar(&tokenFile, "token-file", "", "`FILE` holding the admin bearer token; default env "+admin.TokenEnv)
	var wait time.Duration
	if drain {
		fs.DurationVar(&wait, "wait", 0, "after the drain is accepted, wait up to `DURATION` (e.g. 60s) until no proxy has a request in flight to the replica, printing progress; exit 1 if that does not happen in time")
	}
	usage := fmt.Sprintf("Usage: keyway %s --set SET --replica REPLICA [--admin ADDR] [--token-file FILE]%s\n\n%s\n\n", action, map[bool]string{true: " [--wait DURATION]"}[drain], what)
	if err := parseCLIFlags(fs, args, stderr, usage); err != nil {
		return err
	}
	if set == "" || replica == "" {
		return usageError{fmt.Sprintf("keyway %s needs --set and --replica", action)}
	}
	token, err := cliToken(tokenFile, action)
	if err != nil {
		return err
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	c := cf.client(token) // one client: one probe (admin.ProbePath)
	res, body, err := c.Drain(set, replica, drain)
	if err != nil {
		return err
	}
	if cf.rawJSON {
		_, err := stdout.Write(body)
		return err
	}
	scope := "every proxy (the replica's agent advertises it by gossip)"
	if res.Scope == admin.ScopeThisProxy {
		scope = "this proxy only (static replica, no agent)"
	}
	fmt.Fprintf(stdout, "%s %s/%s: accepted, scope %s\n", res.Action, res.Set, res.Replica, scope)
	if wait > 0 {
		return waitDrained(c, set, replica, wait, stdout)
	}
	return nil
}

// waitDrained prints each change of the replica's drain figures until no
// proxy has a request in flight to it, for at most d.
func waitDrained(c *admin.Client, set, replica string, d time.Duration, stdout io.Writer) error {
	start, last, inflight := time.Now(), "", int64(0)
	ok, err := c.WaitDrained(set, replica, d, func(r admin.ReplicaStatus) {
		line := fmt.Sprintf("%s/%s: state %s, %s, %d in flight on %s", set, replica, r.State,
			map[bool]string{true: "in rotation", false: "out of rotation"}[r.InRotation], r.FleetInflight, plural(r.FleetProxies, "proxy", "proxies"))
		if line != last {
			fmt.Fprintf(stdout, "%6.1fs  %s\n", time.Since(start).Seconds(), line)
		}
		last, inflight = line, r.FleetInflight
	})
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%s/%s not drained within %s: %s still in flight", set, replica, d, plural(int(inflight), "request", "requests"))
	}
	fmt.Fprintf(stdout, "%s/%s drained after %.1fs\n", set, replica, time.Since(start).Seconds())
	return nil
}
