package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"keyway/admin"
)

// keyway create, stop, start, delete and runtime: clients of the run-time
// changes of replica sets (POST, PATCH and DELETE /v1/replica_sets,
// /v1/runtime). Each change goes to every proxy of the fleet.

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// printChange prints a run-time change, or its JSON with --json.
func printChange(stdout io.Writer, cf *cliFlags, body []byte, res admin.SetChange, what string) error {
	if cf.rawJSON {
		_, err := stdout.Write(body)
		return err
	}
	fmt.Fprintf(stdout, "%s %s: version %d, scope %s, via %s\n", what, res.Set, res.Version, res.Scope, res.Via)
	if len(res.Created) > 0 {
		fmt.Fprintf(stdout, "created on Kubernetes: %s\n", strings.Join(res.Created, ", "))
	}
	if len(res.Deleted) > 0 {
		fmt.Fprintf(stdout, "deleted on Kubernetes: %s\n", strings.Join(res.Deleted, ", "))
	}
	return nil
}

const createUsage = `Usage: keyway create -f FILE [--admin ADDR] [--token-file FILE] [--json]

Creates a replica set at run time on every proxy of the fleet, from FILE: a
JSON object with the keys of one replica_sets entry of the configuration
file (- reads standard input), e.g.

  {"name": "users", "match": {"path_prefix": "/users"}, "replicas": 3,
   "key": [{"header": "X-User"}]}

The proxy checks it as it would check the file and answers every problem.
A set of that name must not exist. The set is run-time state: every proxy
serves it, a proxy that starts later learns it, and it wins over the file
until 'keyway runtime clear --set NAME' (see 'keyway runtime export').

A set on a StatefulSet may carry it: statefulset.template is a StatefulSet
manifest (apps/v1; name, namespace, serviceName, replicas and selector may
be left out). keyway creates the StatefulSet and its headless Service,
labelled app.kubernetes.io/managed-by=keyway, and deletes them with the set.
It injects nothing: the pod template runs the keyway agent and mounts its
credentials (docs/kubernetes.md shows a complete one).

`

func runCreate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("create", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var file, tokenFile string
	fs.StringVar(&file, "f", "", "`FILE` with the set's JSON definition, - for standard input; required")
	fs.StringVar(&tokenFile, "token-file", "", "`FILE` holding the admin bearer token; default env "+admin.TokenEnv)
	if err := parseCLIFlags(fs, args, stderr, createUsage); err != nil {
		return err
	}
	if file == "" {
		return usageError{"keyway create needs -f FILE (a JSON replica set definition; - for standard input)"}
	}
	var spec []byte
	var err error
	if file == "-" {
		spec, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	} else {
		spec, err = os.ReadFile(file)
	}
	if err != nil {
		return usageError{fmt.Sprintf("-f: %v", err)}
	}
	token, err := cliToken(tokenFile, "create")
	if err != nil {
		return err
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	res, body, err := cf.client(token).CreateSet(spec)
	if err != nil {
		return createError(err, file)
	}
	return printChange(stdout, cf, body, res, "created")
}

// createError rewords the API's refusal of a create for the CLI's user:
// the problems of the definition name the file and its line where the API
// names the request body ("request body:3: ..." is "users.json:3: ..."),
// and a set that exists is changed with the CLI's commands, not a PATCH.
func createError(err error, file string) error {
	ae, ok := errors.AsType[*admin.APIError](err)
	if !ok {
		return err
	}
	e := *ae
	if file == "-" {
		file = "standard input"
	}
	e.Problems = slices.Clone(e.Problems)
	for i, p := range e.Problems {
		if rest, ok := strings.CutPrefix(p, "request body"); ok && (strings.HasPrefix(rest, ":") || strings.HasPrefix(rest, " ")) {
			e.Problems[i] = file + rest
		}
	}
	if e.Status == http.StatusConflict && strings.HasPrefix(e.Message, admin.ErrSetExists.Error()) {
		e.Message = strings.Replace(e.Message, "change it with PATCH, or delete it first", "change it with keyway scale, stop or start, or delete it first (keyway delete)", 1)
		e.Message = strings.Replace(e.Message, "(GET /v1/runtime says why)", "(keyway runtime says why)", 1)
	}
	return &e
}

const stopStartUsage = `Usage: keyway stop|start --set SET [--admin ADDR] [--token-file FILE] [--json]

stop: every proxy of the fleet answers the set's requests with 503 and
Retry-After, its phase becomes Stopped, and its agents drain their replicas
(every proxy's in-flight requests finish), then stop the processes they
supervise; an agent without a process advertises stopped. Agents keep
running, so that 'keyway start' can start the replicas again and 'keyway
delete' can delete the set.

start: the agents start their processes again, and the set serves as
before: every key goes back to the replica it had.

`

func runStopStart(args []string, stop bool, stdout, stderr io.Writer) error {
	verb := map[bool]string{true: "stop", false: "start"}[stop]
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var set, tokenFile string
	fs.StringVar(&set, "set", "", "replica `SET`; required")
	fs.StringVar(&tokenFile, "token-file", "", "`FILE` holding the admin bearer token; default env "+admin.TokenEnv)
	if err := parseCLIFlags(fs, args, stderr, stopStartUsage); err != nil {
		return err
	}
	if set == "" {
		return usageError{"keyway " + verb + " needs --set"}
	}
	token, err := cliToken(tokenFile, verb)
	if err != nil {
		return err
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	res, body, err := cf.client(token).PatchSet(set, admin.SetPatch{Stop: &stop})
	if err != nil {
		return err
	}
	return printChange(stdout, cf, body, res, map[bool]string{true: "stopped", false: "started"}[stop])
}

const deleteUsage = `Usage: keyway delete --set SET [--admin ADDR] [--token-file FILE] [--json]

Deletes a replica set on every proxy of the fleet. It is refused, naming
them, while any replica of the set is starting, ready, recovering or
draining (and while the set has static replicas, unless it is stopped):
stop the set first ('keyway stop --set SET'), then delete it once its
replicas are stopped. A set the configuration file defines stays deleted
until 'keyway runtime clear --set SET'.

`

func runDelete(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("delete", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var set, tokenFile string
	fs.StringVar(&set, "set", "", "replica `SET`; required")
	fs.StringVar(&tokenFile, "token-file", "", "`FILE` holding the admin bearer token; default env "+admin.TokenEnv)
	if err := parseCLIFlags(fs, args, stderr, deleteUsage); err != nil {
		return err
	}
	if set == "" {
		return usageError{"keyway delete needs --set"}
	}
	token, err := cliToken(tokenFile, "delete")
	if err != nil {
		return err
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	res, body, err := cf.client(token).DeleteSet(set)
	if ae, ok := errors.AsType[*admin.APIError](err); ok {
		// The CLI's user stops a set with the CLI.
		e := *ae
		e.Message = strings.Replace(e.Message, ` (keyway stop --set `+set+`, or PATCH {"stop": true})`, ` (keyway stop --set `+set+`)`, 1)
		return &e
	}
	if err != nil {
		return err
	}
	return printChange(stdout, cf, body, res, "deleted")
}

const runtimeUsage = `Usage: keyway runtime [--admin ADDR] [--json]
       keyway runtime export [--admin ADDR]
       keyway runtime clear --set SET [--admin ADDR] [--token-file FILE]

The fleet's run-time state: the replica set changes made through the admin
API (create, delete, stop, start, scale), which every proxy lays over its
configuration file. The run-time state wins, per set and per key it sets.

  (no subcommand)  list it, with who changed each set, through which proxy
  export           print the sets as the proxy serves them (file and run-time
                   state together) as YAML for the replica_sets key of the file
  clear --set S    drop a set's run-time state: the file decides again

To write the run-time state back to the file: export, put the sets in the
file of every proxy, reload them, then clear each set.

`

func runRuntime(args []string, stdout, stderr io.Writer) error {
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("runtime", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var set, tokenFile string
	if sub == "clear" {
		fs.StringVar(&set, "set", "", "replica `SET`; required")
		fs.StringVar(&tokenFile, "token-file", "", "`FILE` holding the admin bearer token; default env "+admin.TokenEnv)
	}
	if err := parseCLIFlags(fs, args, stderr, runtimeUsage); err != nil {
		return err
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	switch sub {
	case "":
		st, body, err := cf.client("").Runtime()
		if err != nil {
			return err
		}
		if cf.rawJSON {
			_, err := stdout.Write(body)
			return err
		}
		printRuntime(stdout, st)
		return nil
	case "export":
		b, err := cf.client("").Export()
		if err != nil {
			return err
		}
		_, err = stdout.Write(b)
		return err
	case "clear":
		if set == "" {
			return usageError{"keyway runtime clear needs --set"}
		}
		token, err := cliToken(tokenFile, "runtime clear")
		if err != nil {
			return err
		}
		res, body, err := cf.client(token).ClearRuntime(set)
		if err != nil {
			return err
		}
		return printChange(stdout, cf, body, res, "cleared")
	default:
		fmt.Fprint(stderr, runtimeUsage)
		return usageError{fmt.Sprintf("unknown runtime subcommand %q: use export or clear", sub)}
	}
}

func printRuntime(w io.Writer, st admin.RuntimeStatus) {
	synced := "synced with the fleet"
	if !st.Synced {
		synced = "NOT synced with the fleet yet"
	}
	where := "in memory"
	if st.StateDir != "" {
		where = st.StateDir
	}
	fmt.Fprintf(w, "run-time state: %s, digest %s, %s, kept %s\n", plural(len(st.Records), "record", "records"), orDash(st.Digest), synced, where)
	if len(st.Records) == 0 {
		fmt.Fprintln(w, "no run-time changes: the configuration file decides every set")
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SET\tVERSION\tACTION\tOVERRIDES\tBY\tVIA\tAT")
		for _, r := range st.Records {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Set, r.Version, r.Action, overrides(r), orDash(r.By), orDash(r.Via), r.At.Local().Format(time.DateTime))
		}
		tw.Flush()
	}
	for _, p := range st.Problems {
		fmt.Fprintf(w, "NOT APPLIED HERE: %s (version %d): %s\n", p.Set, p.Version, p.Problem)
	}
}

func overrides(r admin.RuntimeRecord) string {
	var o []string
	switch {
	case r.Deleted:
		return "deleted"
	case len(r.Spec) > 0:
		o = append(o, "definition")
	}
	if r.Stopped != nil {
		o = append(o, fmt.Sprintf("stopped=%v", *r.Stopped))
	}
	if r.Replicas != nil {
		o = append(o, fmt.Sprintf("replicas=%d", *r.Replicas))
	}
	if len(o) == 0 {
		return "none (the file decides)"
	}
	return strings.Join(o, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
