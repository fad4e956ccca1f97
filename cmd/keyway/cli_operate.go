package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"keyway/admin"
	"keyway/balancer"
)

// keyway reload and keyway scale: clients of POST /v1/reload and PATCH
// /v1/replica_sets/{set}, with the bearer token like drain. The other
// run-time changes of sets are in cli_sets.go.

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
	if err := cf.checkAddr(); err != nil {
		return err
	}
	res, body, err := cf.client(token).Reload()
	if cf.rawJSON && body != nil && (err == nil || strings.Contains(string(body), `"problems"`)) {
		if _, werr := stdout.Write(body); werr != nil {
			return werr
		}
	}
	if err != nil {
		return err
	}
	if cf.rawJSON {
		return nil
	}
	if len(res.Keys) == 0 {
		fmt.Fprintf(stdout, "reloaded %s: no change\n", res.File)
		return nil
	}
	fmt.Fprintf(stdout, "reloaded %s: %s changed\n", res.File, plural(len(res.Keys), "key", "keys"))
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

// plural is n and the noun for that many, one or many: "1 proxy", "0
// proxies", "2 proxies". Every count the CLI prints goes through it.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

const scaleUsage = `Usage: keyway scale --set SET --replicas N [--admin ADDR] [--token-file FILE] [--json]

Changes a replica set's replica count on every proxy of the fleet: ask any
one. For a set with a run section (keyway runs its replicas, docs/runner.md)
it is the number of running jobs: a scale-out starts the new replicas, a
scale-in stops the highest ones as removals (drained on every proxy first,
their keys re-placed at once). For any other set it is the declared count
its phase compares the ready replicas with (fewer ready reads Degraded):
start or stop the replicas yourself. It is run-time state: it outlives
reloads and proxy restarts while any proxy runs (and all restarts with
runtime.state_dir), and wins over the file's replicas key until 'keyway
runtime clear'.

`

func runScale(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var set, tokenFile string
	var replicas int
	fs.StringVar(&set, "set", "", "replica `SET`; required")
	fs.IntVar(&replicas, "replicas", 0, fmt.Sprintf("the declared replica `COUNT`, 1..%d; required", balancer.MaxReplicas))
	fs.StringVar(&tokenFile, "token-file", "", "`FILE` holding the admin bearer token; default env "+admin.TokenEnv)
	if err := parseCLIFlags(fs, args, stderr, scaleUsage); err != nil {
		return err
	}
	given := false // --replicas 0 is a value out of range, not a missing flag
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "replicas" })
	switch {
	case set == "" || !given:
		return usageError{fmt.Sprintf("keyway scale needs --set SET and --replicas N (N from 1 to %d)", balancer.MaxReplicas)}
	case replicas < 1 || replicas > balancer.MaxReplicas:
		return usageError{fmt.Sprintf("--replicas %d: the declared replica count must be 1 to %d (to stop a set, use keyway stop --set %s)", replicas, balancer.MaxReplicas, set)}
	}
	token, err := cliToken(tokenFile, "scale")
	if err != nil {
		return err
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	res, body, err := cf.client(token).Scale(set, replicas)
	if err != nil {
		return err
	}
	if cf.rawJSON {
		_, err := stdout.Write(body)
		return err
	}
	fmt.Fprintf(stdout, "scale %s: declared %d (was %d), scope %s, version %d\n", res.Set, deref(res.Replicas), deref(res.Previous), res.Scope, res.Version)
	return nil
}

const repairUsage = `Usage: keyway repair --set SET [--admin ADDR] [--token-file FILE] [--json]

Revives a replica set: every agent of the set whose supervised replica gave
up (state failed) resets its restart budget and starts it again, and every
proxy lifts its health holds (ejections, supervision holds) on the set's
replicas, so that a repaired replica comes back into rotation. Ask any proxy:
it tells the agents and the other proxies by gossip. On a set on a
StatefulSet, it also deletes the pods in CrashLoopBackOff or Failed, and
those of failed replicas whose agent supervises no process: the StatefulSet
makes them again under the same names.

Refused at once (exit 1, HTTP 409) when it could do nothing: no replica is
failed and every one is in rotation on the asked proxy, or the failed
replicas' agents supervise no process (run without -- CMD). The message
names the replicas, the reason and the fix.

`

func runRepair(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("repair", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var set, tokenFile string
	fs.StringVar(&set, "set", "", "replica `SET`; required")
	fs.StringVar(&tokenFile, "token-file", "", "`FILE` holding the admin bearer token; default env "+admin.TokenEnv)
	if err := parseCLIFlags(fs, args, stderr, repairUsage); err != nil {
		return err
	}
	if set == "" {
		return usageError{"keyway repair needs --set"}
	}
	token, err := cliToken(tokenFile, "repair")
	if err != nil {
		return err
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	res, body, err := cf.client(token).Repair(set)
	if err != nil {
		return err
	}
	if cf.rawJSON {
		_, err := stdout.Write(body)
		return err
	}
	fmt.Fprintf(stdout, "repair %s: accepted; told %s (%d of them failed: %s) and %s; holds lifted here: %s\n",
		res.Set, plural(len(res.Agents), "agent", "agents"), len(res.Failed), dash(strings.Join(res.Failed, ", ")),
		plural(res.Proxies, "other proxy", "other proxies"), dash(strings.Join(res.Reset, ", ")))
	if len(res.Pods) > 0 {
		fmt.Fprintf(stdout, "repair %s: deleted pods %s; their StatefulSet makes them again\n", res.Set, strings.Join(res.Pods, ", "))
	}
	return nil
}

const restartUsage = `Usage: keyway restart --set SET [--force] [--step-timeout D] [--admin ADDR] [--token-file FILE]
       keyway restart --set SET --ack [--admin ADDR] [--token-file FILE]

Rolling restart of a replica set whose agents supervise their replica's
process (keyway agent ... -- CMD): one replica at a time, drained on every
proxy, its process restarted once nothing is in flight to it, undrained
once the new process has started, and the next one once it is back in
rotation. Prints each step as it happens; stops, undrains that replica and
exits 1 when a step does not complete within --step-timeout. On a set
on a StatefulSet, a replica whose agent supervises no process is restarted
by deleting its pod: the step ends once the pod is made again under the
same name and its new agent is back in rotation.

Refused at once (exit 1, HTTP 409), before anything is drained, when an
agent of the set could not restart its replica: it supervises no process
(run without -- CMD) and its set names no StatefulSet, or no agent of the
replica is alive. The message
names the replicas, the reason and the fix.

--force restarts each replica's process as soon as it is out of rotation,
without waiting for its requests in flight: for replicas that hang in
their drain. Those requests fail. The restart is recorded and audited as
forced.

--ack acknowledges the set's failed or interrupted last restart: the
dashboard no longer marks it (it also stops once the set is Running again).
The restart's record stays; GET /v1/replica_sets/SET/restart shows it.

`

func runRestart(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("restart", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var set, tokenFile string
	var step time.Duration
	var force, ack bool
	fs.StringVar(&set, "set", "", "replica `SET`; required")
	fs.DurationVar(&step, "step-timeout", 0, "bound on each step (`DURATION`); default 2m")
	fs.BoolVar(&force, "force", false, "restart each replica once out of rotation, without waiting for its requests in flight")
	fs.BoolVar(&ack, "ack", false, "acknowledge the set's failed last restart (no restart)")
	fs.StringVar(&tokenFile, "token-file", "", "`FILE` holding the admin bearer token; default env "+admin.TokenEnv)
	if err := parseCLIFlags(fs, args, stderr, restartUsage); err != nil {
		return err
	}
	if set == "" {
		return usageError{"keyway restart needs --set"}
	}
	if ack && (force || step != 0) {
		return usageError{"keyway restart --ack starts no restart: leave out --force and --step-timeout"}
	}
	token, err := cliToken(tokenFile, "restart")
	if err != nil {
		return err
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	c := cf.client(token)
	if ack {
		st, _, err := c.AckRestart(set)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "rolling restart of %s (%s at %s: %s) acknowledged by %s; the dashboard no longer marks it\n",
			set, st.State, st.Finished.Local().Format(time.DateTime), st.Error, st.AcknowledgedBy)
		return nil
	}
	st, _, err := c.RestartWith(set, admin.RestartOptions{StepTimeout: step, Force: force})
	if err != nil {
		return err
	}
	mode := ""
	switch {
	case st.Force:
		mode = ", forced: no wait for requests in flight"
	case force:
		fmt.Fprintf(stderr, "keyway: the proxy at %s does not know --force (an older version): this restart waits for each replica's drain\n", cf.admin)
	}
	fmt.Fprintf(stdout, "rolling restart of %s: %s (each step within %s%s)\n", st.Set, strings.Join(st.Replicas, ", "), st.StepTimeout, mode)
	st, err = c.FollowRestart(set, st, 0, func(s admin.RestartStep) {
		fmt.Fprintf(stdout, "%6.1fs  %-12s %-8s %s\n", s.Time.Sub(st.Started).Seconds(), s.Replica, s.Step, s.Detail)
	})
	if err != nil {
		return err
	}
	if st.State != "done" {
		return fmt.Errorf("rolling restart of %s %s: %s", set, st.State, st.Error)
	}
	fmt.Fprintf(stdout, "rolling restart of %s done in %.1fs\n", set, st.Finished.Sub(st.Started).Seconds())
	return nil
}
