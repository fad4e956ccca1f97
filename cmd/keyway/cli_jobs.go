package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"keyway/admin"
)

const jobsUsage = `Usage: keyway jobs --set SET [--admin ADDR] [--json]

Lists the jobs of a replica set whose replicas keyway runs (its run
section): for each replica, its agent's state (running, stopping, starting,
backoff, failed), the replica's lifecycle state, the replica process's PID,
restarts and last exit, the job's age and its log file. Ask the proxy that
runs them: the one holding the set's state directory lock (another proxy
says which process holds it).

`

func runJobs(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	cf := newCLIFlags(fs)
	var set string
	fs.StringVar(&set, "set", "", "replica `SET`; required")
	if err := parseCLIFlags(fs, args, stderr, jobsUsage); err != nil {
		return err
	}
	if set == "" {
		return usageError{"keyway jobs needs --set SET"}
	}
	if err := cf.checkAddr(); err != nil {
		return err
	}
	st, raw, err := cf.client("").Jobs(set)
	if err != nil {
		return err
	}
	if cf.rawJSON {
		_, err := stdout.Write(raw)
		return err
	}
	printJobs(stdout, st)
	return nil
}

// printJobs writes a set's jobs as a table, with a line saying who runs
// them.
func printJobs(w io.Writer, st admin.JobsStatus) {
	switch {
	case !st.Runs:
		fmt.Fprintf(w, "%s has no run section: keyway does not run its replicas (someone else starts them; its replica count is declared only)\n", st.Set)
		return
	case st.Error != "":
		fmt.Fprintf(w, "%s: %s asked for, none can run here: %s\n", st.Set, plural(st.Wanted, "job", "jobs"), st.Error)
	case !st.Here:
		fmt.Fprintf(w, "%s: %s asked for, run by another process on this host (%s), state_dir %s; ask its proxy\n", st.Set, plural(st.Wanted, "job", "jobs"), dash(st.Holder), st.StateDir)
		return
	default:
		fmt.Fprintf(w, "%s: %s asked for, run by this proxy, state_dir %s\n", st.Set, plural(st.Wanted, "job", "jobs"), st.StateDir)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tJOB\tREPLICA STATE\tADDR\tPID\tRESTARTS\tLAST EXIT\tAGE\tAGENT PID\tLOG")
	for _, j := range st.Jobs {
		state := j.State
		if j.State == "backoff" {
			state += " until " + j.RetryAt.Local().Format("15:04:05")
		}
		last := j.LastExit
		if last == "" {
			last = j.AgentLastExit
		}
		if j.Error != "" {
			last = j.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", j.Replica, state, dash(j.ReplicaState), dash(j.Addr),
			pidText(j.Pid), j.Restarts, dash(last), dash(j.Age), pidText(j.AgentPid), j.Log)
	}
	tw.Flush()
}

func pidText(pid int) string {
	if pid == 0 {
		return "-"
	}
	return strconv.Itoa(pid)
}
