package main

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"keyway/internal/atomicfile"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"

	yaml "go.yaml.in/yaml/v3"

	"keyway/balancer"
	"keyway/fleetauth"
)

// keyway keys: makes the fleet's signing keys (package fleetauth) and
// writes what each role holds: proxy.yaml for proxies, agent-SET.yaml for
// the agents of each set, and the same as Kubernetes Secrets. The
// directory it writes is also what it reads to rotate keys and add sets.

const keysUsage = `Usage: keyway keys --sets SET,... --out DIR [--namespace NS] [--force]
       keyway keys --rotate add|promote|retire --in DIR [--out DIR]
       keyway keys --add-set SET,... --in DIR [--out DIR]

Makes the fleet's signing keys (Ed25519): a proxy key, whose private half
only proxies hold, and an agent key per replica set, whose private half
only that set's agents hold. Every member holds every public key. Writes,
in DIR (made with mode 0700; files 0600):

  proxy.yaml                 the proxies' credentials file
  agent-SET.yaml             the credentials file of set SET's agents
  proxy.secret.yaml          Secret keyway-proxy-credentials
  agent-SET.secret.yaml      Secret keyway-agent-SET-credentials

Each file goes where gossip.credentials_file names it (proxy and agent
configurations alike); each Secret holds its file under the key
credentials.yaml, for the manifests in deploy/kubernetes. Existing files
are not overwritten without --force.

--rotate replaces every key in three stages, without downtime. After each
stage, give every proxy and agent its new file, reload each proxy (it reads
the file again) and restart each agent (it reads the file at start), and
go on only once every member runs with it:

  add       a new key joins each list: it verifies, the old one still signs
  promote   the new key signs; the old one still verifies
  retire    the old key is removed

--add-set makes the agent key of a new set. Every proxy needs its public
key (rewritten proxy.yaml) before the set's first agent starts.

--rotate and --add-set read DIR as keyway keys wrote it and, without --out,
rewrite it in place. Keep DIR safe: its private keys sign for the fleet.
See docs/membership.md, "Security".

`

// The files keyway keys writes in its directory.
const (
	proxyCredsFile  = "proxy.yaml"
	proxySecretFile = "proxy.secret.yaml"
	// credentialsKey is the Secrets' key for the file, the file name in
	// their mount.
	credentialsKey = "credentials.yaml"
)

func agentCredsFile(set string) string  { return "agent-" + set + ".yaml" }
func agentSecretFile(set string) string { return "agent-" + set + ".secret.yaml" }

// Secret names, as the manifests in deploy/kubernetes mount them.
// Kubernetes names take no '_', which set names may have.
const proxySecretName = "keyway-proxy-credentials"

func agentSecretName(set string) string {
	return "keyway-agent-" + strings.ReplaceAll(set, "_", "-") + "-credentials"
}

// The stages of a rotation (--rotate).
const (
	stageAdd     = "add"
	stagePromote = "promote"
	stageRetire  = "retire"
)

func runKeys(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("keys", flag.ContinueOnError)
	var sets, out, in, ns, rotate, addSet string
	var force bool
	fs.StringVar(&sets, "sets", "", "the replica `SETS` to make agent keys for, comma-separated (e.g. orders,users)")
	fs.StringVar(&out, "out", "", "`DIR` to write to (made if missing); with --rotate and --add-set, default --in")
	fs.StringVar(&in, "in", "", "`DIR` keyway keys wrote before: what --rotate and --add-set read")
	fs.StringVar(&ns, "namespace", "keyway", "the Secrets' Kubernetes `NAMESPACE`; with --in, default the one of DIR's "+proxySecretFile)
	fs.StringVar(&rotate, "rotate", "", "rotate every key: `STAGE` add, promote or retire (see above)")
	fs.StringVar(&addSet, "add-set", "", "make agent keys for new replica `SETS`, comma-separated")
	fs.BoolVar(&force, "force", false, "overwrite existing files in --out (with --rotate and --add-set: files other than those read from --in)")
	if err := parseCLIFlags(fs, args, stderr, keysUsage); err != nil {
		return err
	}
	nsGiven := false
	fs.Visit(func(f *flag.Flag) { nsGiven = nsGiven || f.Name == "namespace" })

	var creds fleetauth.Credentials
	var done, then string // what changed and what comes next, for the summary
	var running []string  // the sets whose agents run already (--in)
	switch {
	case rotate != "" && addSet != "":
		return usageError{"--rotate and --add-set: one at a time (finish the rotation, or add the set first)"}
	case rotate == "" && addSet == "":
		if in != "" {
			return usageError{"--in DIR is read by --rotate and --add-set; to make new keys, pass --sets SET,... --out DIR"}
		}
		if out == "" {
			return usageError{"keyway keys needs --out DIR (e.g. keyway keys --sets orders --out secrets/)"}
		}
		names, err := setList("--sets", sets)
		if err != nil {
			return err
		}
		creds = fleetauth.Generate(names)
		done = "new fleet credentials"
		if len(names) == 0 {
			then = "No agent keys (no --sets): add a set's with keyway keys --add-set SET --in " + out + "."
		}
	default:
		if in == "" {
			return usageError{"--rotate and --add-set need --in DIR: the directory keyway keys wrote"}
		}
		if sets != "" {
			return usageError{"--sets makes new credentials; to add sets to those in --in, use --add-set " + sets}
		}
		if out == "" {
			out = in
		}
		if !nsGiven {
			if n := secretNamespace(filepath.Join(in, proxySecretFile)); n != "" {
				ns = n
			}
		}
		var err error
		if creds, err = readKeyDir(in); err != nil {
			return err
		}
		running = sortedSets(creds)
		if rotate != "" {
			if creds, err = rotateKeys(creds, rotate); err != nil {
				return err
			}
			done, then = rotateSummary(rotate, out)
		} else {
			names, err := addSets(creds, addSet, in)
			if err != nil {
				return err
			}
			done = "agent keys for set " + strings.Join(names, ", ") + " added"
			then = "Every proxy needs the new public key before the first agent of " + strings.Join(names, ", ") +
				" starts (else its claim to its name is refused: unknown_key): reload them first. The other sets' agents count its claims as unknown_key until they run with their new file."
		}
	}
	if err := validNamespace(ns); err != nil {
		return err
	}
	files, err := keyFiles(creds, ns)
	if err != nil {
		return err
	}
	// Rewriting the directory read is the point of --rotate and --add-set.
	inPlace := in != "" && samePath(in, out)
	if err := writeKeyFiles(out, files, force || inPlace); err != nil {
		return err
	}
	var next []string
	if rotate == "" && addSet == "" {
		next = []string{
			"Kubernetes: " + kubectlApply(out, files) + " (the manifests in deploy/kubernetes mount these Secrets).",
			"Elsewhere: copy " + proxyCredsFile + " to every proxy and agent-SET.yaml to the agents of set SET (mode 0600), and name it in gossip.credentials_file.",
		}
	} else {
		next = []string{
			"Give every proxy the new " + proxyCredsFile + " and reload it (keyway reload, SIGHUP: it reads the file again), and every agent its set's agent-SET.yaml and restart it (it reads the file at start).",
			"Kubernetes: " + kubectlApply(out, files) + ", then " + kubectlRestart(ns, running) + " (and kubectl rollout status for each).",
		}
	}
	if then != "" {
		next = append(next, then)
	}
	printKeysSummary(stdout, out, creds, files, done, next)
	return nil
}

// setList parses a comma-separated list of set names given to flag.
func setList(flag, s string) ([]string, error) {
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !balancer.ValidSetName(name) {
			return nil, usageError{fmt.Sprintf("%s %s: %q is not a valid set name: use 1 to 63 lower-case letters, digits, '-' or '_', e.g. orders (the name in the proxies' replica_sets and the agents' replica.set)", flag, s, name)}
		}
		if slices.Contains(out, name) {
			return nil, usageError{fmt.Sprintf("%s %s: %s is named twice", flag, s, name)}
		}
		out = append(out, name)
	}
	return out, nil
}

// validNamespace checks a Kubernetes namespace name (an RFC 1123 label).
func validNamespace(ns string) error {
	ok := ns != "" && len(ns) <= 63
	for i := 0; ok && i < len(ns); i++ {
		c := ns[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(ns)-1
	}
	if !ok {
		return usageError{fmt.Sprintf("--namespace %q: not a Kubernetes namespace name: 1 to 63 lower-case letters, digits or '-', starting and ending with a letter or digit", ns)}
	}
	return nil
}

// keyFile is one file keyway keys writes.
type keyFile struct {
	name string // in the directory
	what string // for the summary
	data []byte
}

// keyFiles renders what each role holds: the credentials files and
// their Secrets.
func keyFiles(c fleetauth.Credentials, ns string) ([]keyFile, error) {
	sets := sortedSets(c)
	secretOf := map[string]string{}
	for _, set := range sets {
		if other, ok := secretOf[agentSecretName(set)]; ok {
			return nil, usageError{fmt.Sprintf("sets %s and %s would share the Secret name %s (Kubernetes names take no '_'): rename one", other, set, agentSecretName(set))}
		}
		secretOf[agentSecretName(set)] = set
	}
	proxy := c.ForProxy().Marshal(proxyHeader(c))
	files := []keyFile{{proxyCredsFile, "the proxies' credentials: every public key, the proxy private key", proxy}}
	for _, set := range sets {
		files = append(files, keyFile{agentCredsFile(set), "the credentials of the agents of set " + set + ": every public key, the set's agent private key",
			c.ForAgent(set).Marshal(agentHeader(c, set))})
	}
	files = append(files, keyFile{proxySecretFile, "Secret " + ns + "/" + proxySecretName + " (" + proxyCredsFile + ")",
		secretManifest(proxySecretName, ns, "the proxies' keyway credentials ("+proxyCredsFile+"): mount it into the proxy containers only", proxy)})
	for i, set := range sets {
		files = append(files, keyFile{agentSecretFile(set), "Secret " + ns + "/" + agentSecretName(set) + " (" + agentCredsFile(set) + ")",
			secretManifest(agentSecretName(set), ns, "the keyway credentials of the agents of set "+set+" ("+agentCredsFile(set)+"): mount it into the agent containers of that set only", files[1+i].data)})
	}
	return files, nil
}

func proxyHeader(c fleetauth.Credentials) string {
	return `keyway fleet credentials: the PROXIES' file, made by keyway keys.
It holds the proxy private key, which signs what changes state across the
fleet: run-time records, commands to agents, fleet views and a proxy's claim
to its role. Only proxies may hold it: whoever has it can do what a proxy
does. It also lists every public key (the proxies' and every set's agents').
Use it on every proxy: gossip.credentials_file: /path/to/this/file
(mode 0600; on Kubernetes the Secret ` + proxySecretName + `).
Proxy key: ` + keyStatus(c.Proxy)
}

func agentHeader(c fleetauth.Credentials, set string) string {
	return `keyway fleet credentials: the file of the AGENTS OF SET ` + set + `, made by keyway keys.
It holds the agent private key of set ` + set + `, which signs the claim of a
replica of the set to its name (its gossip metadata) and its agent's reports.
Only the agents of set ` + set + ` may hold it: whoever has it can claim the name
of a replica of the set that is not alive. It also lists every public key,
and no other private key.
Use it in every agent of set ` + set + `: gossip.credentials_file: /path/to/this/file
(mode 0600; on Kubernetes the Secret ` + agentSecretName(set) + `).
Agent key of set ` + set + `: ` + keyStatus(c.Agents[set])
}

// secretManifest is a Kubernetes Secret holding a credentials file under
// the key credentials.yaml.
func secretManifest(name, ns, what string, file []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# A Kubernetes Secret, made by keyway keys: %s.\n", what)
	b.WriteString("# It holds private keys: apply it (kubectl apply -f FILE), keep it out of version control.\n")
	b.WriteString("apiVersion: v1\nkind: Secret\nmetadata:\n")
	fmt.Fprintf(&b, "  name: %s\n  namespace: %s\n", name, ns)
	b.WriteString("  labels: {app.kubernetes.io/part-of: keyway}\ntype: Opaque\nstringData:\n")
	b.WriteString("  " + credentialsKey + ": |\n")
	for _, l := range strings.SplitAfter(string(file), "\n") {
		if l != "" {
			b.WriteString("    " + l)
		}
	}
	return b.Bytes()
}

// secretNamespace returns the namespace of a Secret manifest keyway keys
// wrote, or "" when there is none to read.
func secretNamespace(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var s struct {
		Metadata struct {
			Namespace string `yaml:"namespace"`
		} `yaml:"metadata"`
	}
	if yaml.Unmarshal(b, &s) != nil {
		return ""
	}
	return s.Metadata.Namespace
}

// readKeyDir reads the credentials keyway keys wrote in dir into one set:
// every public key and the proxy's private keys from proxy.yaml, each
// set's private keys from agent-SET.yaml. The files must agree on every
// public key and hold only their own role's private keys.
func readKeyDir(dir string) (fleetauth.Credentials, error) {
	bad := func(format string, args ...any) error {
		return usageError{fmt.Sprintf("--in %s: ", dir) + fmt.Sprintf(format, args...)}
	}
	load := func(name string) (fleetauth.Credentials, error) {
		c, err := fleetauth.Load(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			return c, bad("no %s: not a directory keyway keys wrote (make one with keyway keys --sets SET,... --out DIR)", name)
		}
		if err != nil {
			return c, bad("%v", err)
		}
		return c, nil
	}
	proxy, err := load(proxyCredsFile)
	if err != nil {
		return fleetauth.Credentials{}, err
	}
	if len(proxy.Proxy.Private) == 0 {
		return fleetauth.Credentials{}, bad("%s holds no proxy private key: it is not the proxies' file", proxyCredsFile)
	}
	for set, l := range proxy.Agents {
		if len(l.Private) > 0 {
			return fleetauth.Credentials{}, bad("%s holds the agent private key of set %s, which proxies must not hold: not a file keyway keys wrote", proxyCredsFile, set)
		}
	}
	creds := proxy.ForProxy()
	for set := range proxy.Agents {
		name := agentCredsFile(set)
		a, err := load(name)
		if err != nil {
			return fleetauth.Credentials{}, err
		}
		if len(a.Proxy.Private) > 0 {
			return fleetauth.Credentials{}, bad("%s holds the proxy private key, which agents must not hold: not a file keyway keys wrote", name)
		}
		for other, l := range a.Agents {
			if other != set && len(l.Private) > 0 {
				return fleetauth.Credentials{}, bad("%s holds the agent private key of set %s, not only its own: not a file keyway keys wrote", name, other)
			}
		}
		if len(a.Agents[set].Private) == 0 {
			return fleetauth.Credentials{}, bad("%s holds no agent private key of set %s", name, set)
		}
		if !samePublic(proxy, a) {
			return fleetauth.Credentials{}, bad("%s and %s list different public keys: they are not from one run of keyway keys (a stage of a rotation half written?)", proxyCredsFile, name)
		}
		l := creds.Agents[set]
		l.Private = a.Agents[set].Private
		creds.Agents[set] = l
	}
	// An agent file of a set the proxies' file does not know: its public
	// key would be missing everywhere else.
	matches, _ := filepath.Glob(filepath.Join(dir, "agent-*.yaml"))
	for _, m := range matches {
		set := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), "agent-"), ".yaml")
		if _, ok := creds.Agents[set]; !ok && balancer.ValidSetName(set) {
			return fleetauth.Credentials{}, bad("%s is of a set %s does not list: not from the same run of keyway keys (remove it, or add the set with --add-set %s)", filepath.Base(m), proxyCredsFile, set)
		}
	}
	return creds, nil
}

// samePublic reports whether a and b list the same public keys.
func samePublic(a, b fleetauth.Credentials) bool {
	eq := func(x, y fleetauth.KeyList) bool {
		return slices.EqualFunc(x.Public, y.Public, func(p, q ed25519.PublicKey) bool { return p.Equal(q) })
	}
	if !eq(a.Proxy, b.Proxy) || len(a.Agents) != len(b.Agents) {
		return false
	}
	for set, l := range a.Agents {
		m, ok := b.Agents[set]
		if !ok || !eq(l, m) {
			return false
		}
	}
	return true
}

// A key list's place in a rotation. keyway keys writes lists in three
// shapes: one key; the old key and a new one, the old one signing (after
// add: public [old, new], private [old, new]); or the new one signing
// (after promote: public [old, new], private [new, old]).
type rotation int

const (
	rotSettled  rotation = iota // one key
	rotAdded                    // a new key verifies, the old one signs
	rotPromoted                 // the new key signs, the old one verifies
)

func half(priv ed25519.PrivateKey) ed25519.PublicKey { return priv.Public().(ed25519.PublicKey) }

// rotationOf says where a list stands, or why it is none of the shapes.
func rotationOf(l fleetauth.KeyList) (rotation, error) {
	switch {
	case len(l.Public) == 1 && len(l.Private) == 1 && half(l.Private[0]).Equal(l.Public[0]):
		return rotSettled, nil
	case len(l.Public) == 2 && len(l.Private) == 2 && half(l.Private[0]).Equal(l.Public[0]) && half(l.Private[1]).Equal(l.Public[1]):
		return rotAdded, nil
	case len(l.Public) == 2 && len(l.Private) == 2 && half(l.Private[0]).Equal(l.Public[1]) && half(l.Private[1]).Equal(l.Public[0]):
		return rotPromoted, nil
	}
	return 0, fmt.Errorf("%s and %s, not as keyway keys writes them (one key, or an old and a new one during a rotation)", plural(len(l.Public), "public key", "public keys"), plural(len(l.Private), "private key", "private keys"))
}

// keyStatus says, for a file's header, which key of a list signs.
func keyStatus(l fleetauth.KeyList) string {
	r, err := rotationOf(l)
	switch {
	case err != nil:
		return "edited by hand"
	case r == rotAdded:
		return fmt.Sprintf("%s signs; the new key %s verifies, and signs after keyway keys --rotate promote", fleetauth.KeyID(l.Public[0]), fleetauth.KeyID(l.Public[1]))
	case r == rotPromoted:
		return fmt.Sprintf("%s signs; the old key %s verifies until keyway keys --rotate retire", fleetauth.KeyID(l.Public[1]), fleetauth.KeyID(l.Public[0]))
	}
	return fleetauth.KeyID(l.Public[0]) + " signs"
}

// rotateKeys applies a stage of a rotation to every key list. A list
// with one key where the stage needs two (a set added during the
// rotation) is left as it is.
func rotateKeys(c fleetauth.Credentials, stage string) (fleetauth.Credentials, error) {
	type list struct {
		name, set string
		l         fleetauth.KeyList
		r         rotation
	}
	lists := []list{{name: "the proxy key", l: c.Proxy}}
	for _, set := range sortedSets(c) {
		lists = append(lists, list{name: "the agent key of set " + set, set: set, l: c.Agents[set]})
	}
	count := map[rotation]int{}
	for i := range lists {
		r, err := rotationOf(lists[i].l)
		if err != nil {
			return c, usageError{fmt.Sprintf("--rotate %s: %s: %v", stage, lists[i].name, err)}
		}
		lists[i].r = r
		count[r]++
	}
	fail := func(format string, args ...any) error {
		return usageError{"--rotate " + stage + ": " + fmt.Sprintf(format, args...)}
	}
	switch stage {
	case stageAdd:
		if count[rotAdded] > 0 {
			return c, fail("a rotation is under way (its new keys are added): go on with --rotate promote")
		}
		if count[rotPromoted] > 0 {
			return c, fail("a rotation is under way (its new keys sign): finish it with --rotate retire")
		}
		for i := range lists {
			pub, priv := fleetauth.NewKey()
			l := &lists[i].l
			l.Public = append(slices.Clone(l.Public), pub)
			l.Private = append(slices.Clone(l.Private), priv)
		}
	case stagePromote:
		if count[rotAdded] == 0 {
			if count[rotPromoted] > 0 {
				return c, fail("the new keys sign already: the next stage is --rotate retire")
			}
			return c, fail("no rotation is under way: start one with --rotate add")
		}
		for i := range lists {
			if l := &lists[i].l; lists[i].r == rotAdded {
				l.Private = []ed25519.PrivateKey{l.Private[1], l.Private[0]}
			}
		}
	case stageRetire:
		for _, e := range lists {
			if e.r == rotAdded {
				return c, fail("%s: its new key does not sign yet: run --rotate promote, give every member its new file, and retire after that", e.name)
			}
		}
		if count[rotPromoted] == 0 {
			return c, fail("no rotation is under way: start one with --rotate add")
		}
		for i := range lists {
			if l := &lists[i].l; lists[i].r == rotPromoted {
				l.Public = []ed25519.PublicKey{l.Public[1]}
				l.Private = []ed25519.PrivateKey{l.Private[0]}
			}
		}
	default:
		return c, usageError{fmt.Sprintf("--rotate %q: the stages are add, promote and retire, in that order", stage)}
	}
	out := fleetauth.Credentials{Proxy: lists[0].l, Agents: map[string]fleetauth.KeyList{}}
	for _, e := range lists[1:] {
		out.Agents[e.set] = e.l
	}
	return out, nil
}

// addSets adds an agent key for each set named in the --add-set value.
func addSets(c fleetauth.Credentials, value, in string) ([]string, error) {
	names, err := setList("--add-set", value)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, usageError{"--add-set needs a set name (e.g. --add-set users)"}
	}
	for _, set := range names {
		if _, ok := c.Agents[set]; ok {
			return nil, usageError{fmt.Sprintf("--add-set %s: set %s has agent keys already (in %s)", value, set, filepath.Join(in, proxyCredsFile))}
		}
	}
	for _, set := range names {
		pub, priv := fleetauth.NewKey()
		c.Agents[set] = fleetauth.KeyList{Public: []ed25519.PublicKey{pub}, Private: []ed25519.PrivateKey{priv}}
	}
	return names, nil
}

// sortedSets returns the sets of c's agent keys, sorted.
func sortedSets(c fleetauth.Credentials) []string { return slices.Sorted(maps.Keys(c.Agents)) }

// rotateSummary says what a stage did, and what comes after the rollout.
func rotateSummary(stage, dir string) (done, then string) {
	switch stage {
	case stageAdd:
		return "rotation, stage 1 of 3 (add): a new key in every list; it verifies, the old one still signs",
			"Once every proxy and agent runs with the new files: keyway keys --rotate promote --in " + dir
	case stagePromote:
		return "rotation, stage 2 of 3 (promote): the new keys sign; the old ones still verify",
			"Once every proxy and agent runs with the new files: keyway keys --rotate retire --in " + dir
	}
	return "rotation, stage 3 of 3 (retire): the old keys are gone",
		"The rotation is over once every proxy and agent runs with the new files."
}

// writeKeyFiles writes files to dir, made with mode 0700 if missing,
// each with mode 0600 through a temporary file and a rename. Unless
// replace, no file is written when one of them exists.
func writeKeyFiles(dir string, files []keyFile, replace bool) error {
	if !replace {
		var exist []string
		for _, f := range files {
			if _, err := os.Lstat(filepath.Join(dir, f.name)); err == nil {
				exist = append(exist, f.name)
			}
		}
		if len(exist) > 0 {
			return usageError{fmt.Sprintf("--out %s: %s exist already: keyway keys does not overwrite credentials, which may be in use; "+
				"to change keys without downtime use --rotate add|promote|retire --in %s, to add a set --add-set SET --in %s, or pass --force to replace them",
				dir, strings.Join(exist, ", "), dir, dir)}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range files {
		if err := atomicfile.Write(filepath.Join(dir, f.name), f.data); err != nil {
			return err
		}
	}
	return nil
}

// samePath reports whether a and b name the same directory.
func samePath(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// printKeysSummary prints what was written and the next steps.
func printKeysSummary(w io.Writer, dir string, c fleetauth.Credentials, files []keyFile, done string, next []string) {
	fmt.Fprintf(w, "%s: wrote %s\n", done, dir)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range files {
		fmt.Fprintf(tw, "  %s\t%s\n", f.name, f.what)
	}
	tw.Flush()
	fmt.Fprintf(w, "proxy key: %s\n", keyStatus(c.Proxy))
	for _, set := range sortedSets(c) {
		fmt.Fprintf(w, "agent key of set %s: %s\n", set, keyStatus(c.Agents[set]))
	}
	if fi, err := os.Stat(dir); err == nil && runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		fmt.Fprintf(w, "warning: %s is open to other users (mode %04o): its files are 0600, but consider chmod 700 %s\n", dir, fi.Mode().Perm(), dir)
	}
	fmt.Fprintln(w, "\nNext:")
	next = append(next, "Keep "+dir+": keyway keys --rotate and --add-set read it. Its private keys sign for the fleet: keep it out of version control.")
	for _, n := range next {
		fmt.Fprintf(w, "  - %s\n", n)
	}
}

// kubectlApply is the command that applies the Secrets among files.
func kubectlApply(dir string, files []keyFile) string {
	cmd := "kubectl apply"
	for _, f := range files {
		if strings.HasSuffix(f.name, ".secret.yaml") {
			cmd += " -f " + filepath.Join(dir, f.name)
		}
	}
	return cmd
}

// kubectlRestart is the command that restarts every member of the
// manifests in deploy/kubernetes: the proxies, and a StatefulSet named
// after each of sets.
func kubectlRestart(ns string, sets []string) string {
	cmd := "kubectl -n " + ns + " rollout restart deployment/keyway-proxy"
	for _, set := range sets {
		cmd += " statefulset/" + strings.ReplaceAll(set, "_", "-")
	}
	return cmd
}
