package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"keyway/admin"
)

// keyway plan: the client of GET /v1/replica_sets/{set}/plan.

const planUsage = `Usage: keyway plan --set SET [--add NAME]... [--remove NAME]... [--admin ADDR] [--json]

Shows what adding and removing ring members of a replica set would do,
before anything changes: per replica its partitions now and after and the
share of keys it would gain or lose, the share of keys that move, and the
ring's balance. The proxy computes it from the set's current ring with the
placement code it routes with; nothing changes. --add and --remove may be
repeated. The plan is about the ring (replicas that were ready once): who is
out of rotation right now is not part of it, and weights are not used by
placement. Example, before a scale-out by one:

  keyway plan --set orders --add orders-3

`

// nameList is a repeatable string flag.
type nameList []string

func (l *nameList) String() string { return strings.Join(*l, ",") }

func (l *nameList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

func runPlan(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var set string
	var add, remove nameList
	fs.StringVar(&set, "set", "", "replica `SET` (required)")
	fs.Var(&add, "add", "a replica `NAME` to add to the ring; repeatable")
	fs.Var(&remove, "remove", "a ring member's `NAME` to remove; repeatable")
	if err := parseCLIFlags(fs, args, stderr, planUsage); err != nil {
		return err
	}
	switch {
	case set == "":
		return usageError{"missing --set: keyway plan --set SET --add NAME --remove NAME"}
	case len(add) == 0 && len(remove) == 0:
		return usageError{"keyway plan needs at least one --add NAME or --remove NAME"}
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	p, raw, err := cf.client("").Plan(set, add, remove)
	if ae, ok := errors.AsType[*admin.APIError](err); ok && ae.Param != "" {
		// The API names its query parameter; the user gave a flag.
		return fmt.Errorf("--%s %q: %s", ae.Param, ae.Value, ae.Problem)
	}
	if err != nil {
		return err
	}
	if cf.rawJSON {
		_, err := stdout.Write(raw)
		return err
	}
	printPlan(stdout, p)
	return nil
}

// printPlan prints a plan: a header, one row per replica, a summary line
// and the notes.
func printPlan(w io.Writer, p admin.ReplicaSetPlan) {
	var change []string
	if len(p.Add) > 0 {
		change = append(change, "add "+strings.Join(p.Add, ", "))
	}
	if len(p.Remove) > 0 {
		change = append(change, "remove "+strings.Join(p.Remove, ", "))
	}
	fmt.Fprintf(w, "plan for %s: %s (ring %d → %s, %s, generation %d)\n\n",
		p.Set, strings.Join(change, "; "), p.Now.Members, plural(p.After.Members, "member", "members"), p.Fingerprint, p.Generation)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tNOW\tAFTER\tCHANGE")
	for _, r := range p.Replicas {
		now, after := partsCell(r.PartitionsNow, r.ShareNow), partsCell(r.PartitionsAfter, r.ShareAfter)
		if r.Change == admin.PlanJoins {
			now = "-"
		}
		if r.Change == admin.PlanLeaves {
			after = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, now, after, changeCell(r))
	}
	tw.Flush()

	fmt.Fprintf(w, "\nmoves %.1f%% of keys (%d of %d partitions); balance max/mean %.2f, min/mean %.2f (now %.2f, %.2f)\n",
		100*p.MovedShare, p.MovedPartitions, p.Partitions, p.After.MaxOverMean, p.After.MinOverMean, p.Now.MaxOverMean, p.Now.MinOverMean)
	for _, n := range p.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func partsCell(n int, share float64) string { return fmt.Sprintf("%d (%.1f%%)", n, 100*share) }

// changeCell is the share of keys a replica gains and loses: "+23.2%
// (joins)", "-8.3%", "+0.4% -1.2%" (collateral moves), or "0".
func changeCell(r admin.PlanReplica) string {
	var parts []string
	if r.Gained > 0 {
		parts = append(parts, fmt.Sprintf("+%.1f%%", 100*r.GainedShare))
	}
	if r.Lost > 0 {
		parts = append(parts, fmt.Sprintf("-%.1f%%", 100*r.LostShare))
	}
	if len(parts) == 0 {
		parts = append(parts, "0")
	}
	if r.Change != admin.PlanStays {
		parts = append(parts, "("+r.Change+")")
	}
	return strings.Join(parts, " ")
}
