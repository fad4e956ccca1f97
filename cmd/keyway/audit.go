package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"keyway/eventlog/objstore"
	"keyway/eventlog/query"
)

// keyway audit: reads the audit trail back, from object storage (the
// layout of audit.sink), a copy of it in a directory, or proxies' local
// files (audit.dir), across every proxy's runs.

const auditUsage = `Usage: keyway audit sets [--from SOURCE]
       keyway audit runs SET [--from SOURCE]   (or runs --set SET)
       keyway audit [--from SOURCE] [--set S,...] [--kind K,...] [--replica R]
                    [--partition P | --key KEY] [--since T] [--until T] [--follow] [--json]

Reads the audit trail the proxies wrote, across every proxy's runs:

  sets        the replica sets that have events (listing PREFIX/)
  runs SET    the proxy runs that wrote SET's events: start, node, segments
  (no verb)   the events, oldest first, filtered

SOURCE is where the trail is: s3://BUCKET/PREFIX (what audit.sink names;
credentials and endpoint from the AWS_* environment or workload identity),
a directory holding a copy of that layout (aws s3 sync), or an audit.dir
(each node's events-NNNNNN.jsonl). Default: $KEYWAY_AUDIT_SINK, else
$KEYWAY_AUDIT_DIR, as the proxies are configured.

--partition P (or --key KEY, for the partition the key hashes to) answers
"what happened to partition P of set S": with the ring and rotation changes
each proxy recorded, it works out the partition's owner and the replica
that took it, with the balancer's own code, and keeps the placement in force
when the window opens, the changes that moved the partition, the events of
the replicas that owned or took it, and the set's own events. Each line
ends with where the partition's keys went after it.

Times (--since, --until) are RFC 3339 (2026-12-03T03:12:00Z) or a duration
before now (90m). --follow keeps reading what the proxies write (Ctrl-C to
stop). Events missing from a run (a gap in its sequence numbers) are
reported on stderr.

Examples:
  keyway audit sets
  keyway audit runs orders
  keyway audit --set orders --kind ejected,readmitted --since 2026-12-03T03:00:00Z
  keyway audit --set orders --key order-42 --since 2026-12-03T03:00:00Z --until 2026-12-03T03:30:00Z
  keyway audit --set orders --partition 17 --json

Flags:
`

func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	verb, runsOf := "", ""
	if len(args) > 0 && (args[0] == "sets" || args[0] == "runs") {
		verb, args = args[0], args[1:]
		if verb == "runs" && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			runsOf, args = args[0], args[1:]
		}
	}
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	from := fs.String("from", "", "where the trail is: s3://BUCKET/PREFIX, a copy of it, or an audit.dir (default $KEYWAY_AUDIT_SINK, else $KEYWAY_AUDIT_DIR)")
	pathStyle := fs.Bool("path-style", envBool("KEYWAY_AUDIT_PATH_STYLE"), "address objects as ENDPOINT/BUCKET/KEY (SeaweedFS, MinIO on host:port; default $KEYWAY_AUDIT_PATH_STYLE)")
	sets := fs.String("set", "", "keep the events of these sets (comma-separated; \"-\" for the events of no set)")
	kinds := fs.String("kind", "", "keep these kinds of event (comma-separated: ejected,ring_rebuild,...)")
	replica := fs.String("replica", "", "keep the events of this replica, and the changes that moved it in or out")
	partition := fs.Int("partition", query.NoPartition, "follow this partition of the set (one --set)")
	key := fs.String("key", "", "follow the partition this key hashes to (one --set)")
	since := fs.String("since", "", "keep events at or after this time (RFC 3339, or a duration before now: 90m)")
	until := fs.String("until", "", "keep events before this time (RFC 3339, or a duration before now)")
	follow := fs.Bool("follow", false, "keep reading what the proxies write, until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "with --follow, how often to look for new events")
	asJSON := fs.Bool("json", false, "print each event as a JSON line (with its stream and the partition's placement)")
	if err := parseArgs(fs, args, stderr, func() { fmt.Fprint(fs.Output(), auditUsage); fs.PrintDefaults() }); err != nil {
		return err
	}
	src, err := auditSource(ctx, *from, *pathStyle)
	if err != nil {
		return err
	}
	switch verb {
	case "sets":
		names, err := src.Sets(ctx)
		if err != nil {
			return fmt.Errorf("listing the sets of %s: %w", src, err)
		}
		for _, n := range names {
			if n == "" {
				n = objstore.NoSet + "\t(events of no set: reloads, refused gossip, …)"
			}
			fmt.Fprintln(stdout, n)
		}
		if len(names) == 0 {
			fmt.Fprintf(stderr, "no events in %s yet\n", src)
		}
		return nil
	case "runs":
		set := runsOf
		if set == "" {
			set = *sets
		}
		if set == "" || strings.Contains(set, ",") {
			return usageError{"keyway audit runs SET: give one set (keyway audit sets lists them)"}
		}
		if set == objstore.NoSet || set == "-" {
			set = ""
		}
		runs, err := src.Runs(ctx, set)
		if err != nil {
			return fmt.Errorf("listing the runs of %q in %s: %w", set, src, err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RUN\tSTARTED\tNODE\tSEGMENTS")
		for _, r := range runs {
			started := "-"
			if !r.Start.IsZero() {
				started = r.Start.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", r.ID, started, r.Node, r.Segments)
		}
		return tw.Flush()
	}

	now := time.Now()
	f := query.Filter{Kinds: splitList(*kinds), Replica: *replica, Partition: *partition, Key: *key}
	for _, s := range splitList(*sets) {
		if s == "-" || s == objstore.NoSet {
			s = ""
		}
		f.Sets = append(f.Sets, s)
	}
	if f.Since, err = auditTime("since", *since, now); err != nil {
		return err
	}
	if f.Until, err = auditTime("until", *until, now); err != nil {
		return err
	}
	if err := f.Validate(); err != nil {
		return usageError{strings.ReplaceAll(err.Error(), "\n", "; ")}
	}
	if *interval <= 0 {
		return usageError{fmt.Sprintf("--interval: %s is not a positive duration", *interval)}
	}
	q := &query.Query{Filter: f, Source: src}
	p := &auditPrinter{w: stdout, json: *asJSON, f: f}
	warned := 0
	for {
		ms, err := q.Poll(ctx)
		for _, m := range ms {
			p.print(m)
		}
		ws := q.Warnings()
		for _, w := range ws[warned:] {
			fmt.Fprintln(stderr, "keyway audit:", w)
		}
		warned = len(ws)
		if err != nil {
			return fmt.Errorf("reading %s: %w", src, err)
		}
		if !*follow {
			if p.n == 0 {
				fmt.Fprintf(stderr, "no events match in %s\n", src)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

// auditSource opens the trail at from (or where the proxies' environment
// says it is).
func auditSource(ctx context.Context, from string, pathStyle bool) (query.Source, error) {
	if from == "" {
		from = os.Getenv("KEYWAY_AUDIT_SINK")
	}
	if from == "" {
		from = os.Getenv("KEYWAY_AUDIT_DIR")
	}
	if from == "" {
		return nil, usageError{"--from: no trail to read: give --from s3://BUCKET/PREFIX, or a directory (or set KEYWAY_AUDIT_SINK as for the proxies)"}
	}
	if strings.HasPrefix(from, "s3://") {
		bucket, prefix, err := objstore.ParseURL(from)
		if err != nil {
			return nil, usageError{"--from: " + err.Error()}
		}
		s3, err := objstore.NewS3(ctx, bucket, pathStyle)
		if err != nil {
			return nil, err
		}
		return &query.Store{R: s3, Prefix: prefix, Name: from}, nil
	}
	if strings.Contains(from, "://") {
		return nil, usageError{fmt.Sprintf("--from: %q: only s3:// addresses and directories are read", from)}
	}
	st, err := os.Stat(from)
	if err != nil || !st.IsDir() {
		return nil, usageError{fmt.Sprintf("--from: %q is not a directory or an s3:// address", from)}
	}
	if query.IsAuditDir(from) {
		return &query.Files{Dir: from}, nil
	}
	return &query.Store{R: objstore.Dir{Root: from}, Name: from}, nil
}

// auditTime reads --since or --until: RFC 3339, or a duration before now.
func auditTime(flagName, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, usageError{fmt.Sprintf("--%s: %q is neither an RFC 3339 time (2026-12-03T03:12:00Z) nor a duration before now (90m)", flagName, v)}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func envBool(name string) bool {
	b, _ := strconv.ParseBool(os.Getenv(name))
	return b
}

// auditPrinter prints matches as lines for people, or as JSON lines.
type auditPrinter struct {
	w    io.Writer
	json bool
	f    query.Filter
	n    int
}

// bulky fields are left out of the lines for people (--json has them).
var bulkyFields = []string{"seq", "members", "rotation", "fingerprint"}

func (p *auditPrinter) print(m query.Match) {
	p.n++
	e := m.Event
	if p.json {
		fields := make(map[string]any, len(e.Fields)+2)
		for k, v := range e.Fields {
			fields[k] = v
		}
		fields["stream"] = m.Stream
		if m.Placement != nil {
			fields["placement"] = m.Placement
		}
		e.Fields = fields
		b, _ := json.Marshal(e)
		fmt.Fprintf(p.w, "%s\n", b)
		return
	}
	var b strings.Builder
	b.WriteString(e.Time.UTC().Format("2006-01-02T15:04:05.000Z"))
	b.WriteString("  " + e.Node)
	set := e.Set
	if set == "" {
		set = "-"
	}
	b.WriteString("  " + set + "  " + e.Kind)
	if e.Replica != "" {
		b.WriteString("  " + e.Replica)
	}
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		if !slices.Contains(bulkyFields, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, fieldText(e.Fields[k]))
	}
	if pl := m.Placement; pl != nil {
		fmt.Fprintf(&b, "  | partition %d: %s", pl.Partition, placementText(pl))
	}
	fmt.Fprintln(p.w, b.String())
}

func placementText(pl *query.Placement) string {
	pick := pl.Pick
	if pick == "" {
		pick = "none (503)"
	}
	switch {
	case pl.InForce:
		return fmt.Sprintf("in force at the window's start: owner %s, taken by %s", pl.Owner, pick)
	case pl.Moved && (pl.WasOwner != "" || pl.WasPick != ""):
		wasPick := pl.WasPick
		if wasPick == "" {
			wasPick = "none"
		}
		if pl.WasOwner == pl.Owner {
			return fmt.Sprintf("moved: taken by %s → %s (owner %s)", wasPick, pick, pl.Owner)
		}
		return fmt.Sprintf("moved: owner %s → %s, taken by %s → %s", pl.WasOwner, pl.Owner, wasPick, pick)
	default:
		return fmt.Sprintf("owner %s, taken by %s", pl.Owner, pick)
	}
}

func fieldText(v any) string {
	switch v := v.(type) {
	case string:
		if v == "" || strings.ContainsAny(v, " \t\"") {
			return strconv.Quote(v)
		}
		return v
	case []any, []string, map[string]any:
		b, _ := json.Marshal(v)
		return string(b)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
