package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"

	"keyway/fleetauth"
)

// keysRun runs keyway keys and fails the test on an error.
func keysRun(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := keywayCLI(t, append([]string{"keys"}, args...)...)
	if err != nil {
		t.Fatalf("keyway keys %v: %v\n%s", args, err, errOut)
	}
	return out
}

// keyring builds the keyring a node of role as builds from the file.
func keyring(t *testing.T, path string, as fleetauth.As) *fleetauth.Keyring {
	t.Helper()
	c, err := fleetauth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.Keyring(as)
	if err != nil {
		t.Fatalf("%s as %v: %v", filepath.Base(path), as, err)
	}
	return k
}

var (
	asProxy  = fleetauth.As{Role: fleetauth.RoleProxy}
	asOrders = fleetauth.As{Role: fleetauth.RoleAgent, Set: "orders"}
	asUsers  = fleetauth.As{Role: fleetauth.RoleAgent, Set: "users"}
)

// verifies reports whether what from signs, to verifies as from's role.
func verifies(from, to *fleetauth.Keyring) bool {
	id, sig, ok := from.Sign("keyway/test/v1", []byte("drain orders-1"))
	if !ok {
		return false
	}
	s, err := to.Verify(id, sig, "keyway/test/v1", []byte("drain orders-1"))
	return err == nil && s.Role == from.Self().Role && s.Set == from.Self().Set
}

// The files keyway keys writes hold what each role needs and nothing
// more, parse back, and sign and verify for each other.
func TestKeysWritesEachRolesFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	out := keysRun(t, "--sets", "orders,users", "--out", dir)
	for _, want := range []string{"new fleet credentials: wrote " + dir, "proxy.yaml", "agent-orders.yaml", "agent-users.secret.yaml",
		"kubectl apply -f " + filepath.Join(dir, "proxy.secret.yaml") + " -f " + filepath.Join(dir, "agent-orders.secret.yaml") + " -f " + filepath.Join(dir, "agent-users.secret.yaml"),
		"gossip.credentials_file"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary without %q:\n%s", want, out)
		}
	}
	files := []string{"proxy.yaml", "agent-orders.yaml", "agent-users.yaml", "proxy.secret.yaml", "agent-orders.secret.yaml", "agent-users.secret.yaml"}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if slices.Sort(names); !slices.Equal(names, slices.Sorted(slices.Values(files))) {
		t.Errorf("wrote %v, want %v", names, files)
	}
	if runtime.GOOS != "windows" {
		if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %04o, want 0700", dir, fi.Mode().Perm())
		}
		for _, f := range files {
			if fi, _ := os.Stat(filepath.Join(dir, f)); fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %04o, want 0600", f, fi.Mode().Perm())
			}
		}
	}

	for _, tc := range []struct {
		file    string
		as      fleetauth.As
		notAs   []fleetauth.As // roles the file must not sign for
		header  []string
		private []string // the lists with private keys: "proxy" or a set
	}{
		{"proxy.yaml", asProxy, []fleetauth.As{asOrders, asUsers}, []string{"PROXIES", "Only proxies may hold it", "gossip.credentials_file", "keyway-proxy-credentials"}, []string{"proxy"}},
		{"agent-orders.yaml", asOrders, []fleetauth.As{asProxy, asUsers}, []string{"AGENTS OF SET orders", "Only the agents of set orders may hold it", "gossip.credentials_file", "keyway-agent-orders-credentials"}, []string{"orders"}},
		{"agent-users.yaml", asUsers, []fleetauth.As{asProxy, asOrders}, []string{"AGENTS OF SET users", "keyway-agent-users-credentials"}, []string{"users"}},
	} {
		path := filepath.Join(dir, tc.file)
		raw, _ := os.ReadFile(path)
		for _, h := range tc.header {
			if !strings.Contains(string(raw), h) {
				t.Errorf("%s: header without %q", tc.file, h)
			}
		}
		c, err := fleetauth.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		var private []string
		if len(c.Proxy.Private) > 0 {
			private = append(private, "proxy")
		}
		for _, set := range sortedSets(c) {
			if len(c.Agents[set].Private) > 0 {
				private = append(private, set)
			}
		}
		if !slices.Equal(private, tc.private) {
			t.Errorf("%s holds the private keys of %v, want %v only", tc.file, private, tc.private)
		}
		if !slices.Equal(sortedSets(c), []string{"orders", "users"}) || len(c.Proxy.Public) != 1 {
			t.Errorf("%s does not list every public key: proxy %d, sets %v", tc.file, len(c.Proxy.Public), sortedSets(c))
		}
		if k := keyring(t, path, tc.as); !k.CanSign() || k.Self().Role != tc.as.Role || k.Self().Set != tc.as.Set {
			t.Errorf("%s signs as %v, want %v", tc.file, k.Self(), tc.as)
		}
		for _, as := range tc.notAs {
			if _, err := c.Keyring(as); err == nil {
				t.Errorf("%s builds a keyring for %v: it holds a key it must not", tc.file, as)
			}
		}
	}
	// Every role's signature verifies on every other role's node.
	rings := []*fleetauth.Keyring{
		keyring(t, filepath.Join(dir, "proxy.yaml"), asProxy),
		keyring(t, filepath.Join(dir, "agent-orders.yaml"), asOrders),
		keyring(t, filepath.Join(dir, "agent-users.yaml"), asUsers),
	}
	for _, from := range rings {
		for _, to := range rings {
			if !verifies(from, to) {
				t.Errorf("%v's signature does not verify on %v's node", from.Self(), to.Self())
			}
		}
	}

	// Each Secret holds its file, in the namespace, under the manifests' name.
	for _, tc := range []struct{ secret, name, file string }{
		{"proxy.secret.yaml", "keyway-proxy-credentials", "proxy.yaml"},
		{"agent-orders.secret.yaml", "keyway-agent-orders-credentials", "agent-orders.yaml"},
		{"agent-users.secret.yaml", "keyway-agent-users-credentials", "agent-users.yaml"},
	} {
		raw, _ := os.ReadFile(filepath.Join(dir, tc.secret))
		var s struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
			Metadata   struct {
				Name, Namespace string
			} `yaml:"metadata"`
			StringData map[string]string `yaml:"stringData"`
		}
		if err := yaml.Unmarshal(raw, &s); err != nil {
			t.Fatalf("%s: %v", tc.secret, err)
		}
		file, _ := os.ReadFile(filepath.Join(dir, tc.file))
		if s.APIVersion != "v1" || s.Kind != "Secret" || s.Metadata.Name != tc.name || s.Metadata.Namespace != "keyway" ||
			len(s.StringData) != 1 || s.StringData["credentials.yaml"] != string(file) {
			t.Errorf("%s: %+v, want Secret keyway/%s with credentials.yaml: the content of %s", tc.secret, s, tc.name, tc.file)
		}
	}
}

func TestKeysRefusesToOverwrite(t *testing.T) {
	dir := t.TempDir()
	keysRun(t, "--sets", "orders", "--out", dir)
	before, _ := os.ReadFile(filepath.Join(dir, "proxy.yaml"))
	_, _, err := keywayCLI(t, "keys", "--sets", "orders,users", "--out", dir)
	if err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), "proxy.yaml, agent-orders.yaml") ||
		!strings.Contains(err.Error(), "--force") || !strings.Contains(err.Error(), "--rotate") {
		t.Fatalf("a second run into %s: %v (exit %d), want exit 2 naming the files, --force and --rotate", dir, err, exitCode(err))
	}
	after, _ := os.ReadFile(filepath.Join(dir, "proxy.yaml"))
	if _, err := os.Stat(filepath.Join(dir, "agent-users.yaml")); !bytes.Equal(before, after) || err == nil {
		t.Fatal("the refused run wrote files")
	}
	keysRun(t, "--sets", "orders,users", "--out", dir, "--force")
	if after, _ := os.ReadFile(filepath.Join(dir, "proxy.yaml")); bytes.Equal(before, after) {
		t.Fatal("--force did not replace proxy.yaml")
	}
	// --rotate and --add-set write to another --out only with --force too.
	other := t.TempDir()
	keysRun(t, "--sets", "orders", "--out", other)
	if _, _, err := keywayCLI(t, "keys", "--rotate", "add", "--in", dir, "--out", other); err == nil || !strings.Contains(err.Error(), "exist already") {
		t.Fatalf("--rotate add --out a directory with credentials: %v", err)
	}
}

func TestKeysUsageErrors(t *testing.T) {
	dir := t.TempDir()
	keysRun(t, "--sets", "orders", "--out", dir)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sets", "Orders", "--out", t.TempDir()}, `--sets Orders: "Orders" is not a valid set name: use 1 to 63 lower-case letters, digits, '-' or '_'`},
		{[]string{"--sets", "orders,bad set", "--out", t.TempDir()}, `--sets orders,bad set: "bad set" is not a valid set name`},
		{[]string{"--sets", "orders,orders", "--out", t.TempDir()}, "--sets orders,orders: orders is named twice"},
		{[]string{"--sets", "orders"}, "keyway keys needs --out DIR"},
		{[]string{"--sets", "orders", "--out", t.TempDir(), "--namespace", "Prod"}, `--namespace "Prod": not a Kubernetes namespace name`},
		{[]string{"--sets", "my_set,my-set", "--out", t.TempDir()}, "sets my-set and my_set would share the Secret name keyway-agent-my-set-credentials"},
		{[]string{"--in", dir}, "--in DIR is read by --rotate and --add-set"},
		{[]string{"--rotate", "add"}, "--rotate and --add-set need --in DIR"},
		{[]string{"--rotate", "later", "--in", dir}, `--rotate "later": the stages are add, promote and retire, in that order`},
		{[]string{"--rotate", "add", "--add-set", "users", "--in", dir}, "--rotate and --add-set: one at a time"},
		{[]string{"--rotate", "add", "--sets", "users", "--in", dir}, "to add sets to those in --in, use --add-set users"},
		{[]string{"--add-set", "Users", "--in", dir}, `--add-set Users: "Users" is not a valid set name`},
		{[]string{"--add-set", "orders", "--in", dir}, "--add-set orders: set orders has agent keys already"},
		{[]string{"--rotate", "add", "--in", t.TempDir()}, "no proxy.yaml: not a directory keyway keys wrote"},
	} {
		out, _, err := keywayCLI(t, append([]string{"keys"}, tc.args...)...)
		if err == nil || exitCode(err) != exitConfig || out != "" || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("keys %v: %v (exit %d), stdout %q; want exit 2 and %q", tc.args, err, exitCode(err), out, tc.want)
		}
	}
}

// snapshot is a directory's credentials at one stage of a rotation: the
// keyring each role builds from its file.
type snapshot map[string]*fleetauth.Keyring

func snap(t *testing.T, dir string) snapshot {
	t.Helper()
	return snapshot{
		"proxy":  keyring(t, filepath.Join(dir, "proxy.yaml"), asProxy),
		"orders": keyring(t, filepath.Join(dir, "agent-orders.yaml"), asOrders),
	}
}

// A rotation's stages keep every member able to talk to every other while
// some run with the files of the stage before and some with the new ones;
// after the last stage the old keys verify nowhere.
func TestKeysRotation(t *testing.T) {
	dir := t.TempDir()
	keysRun(t, "--sets", "orders", "--out", dir, "--namespace", "prod")
	start := snap(t, dir)
	prev := start
	for _, tc := range []struct {
		stage string
		want  string // in the summary
		// refused: the stages that may not follow this one
		refused map[string]string
	}{
		{"add", "stage 1 of 3 (add)", map[string]string{
			"add": "a rotation is under way (its new keys are added): go on with --rotate promote", "retire": "its new key does not sign yet"}},
		{"promote", "stage 2 of 3 (promote)", map[string]string{
			"add": "a rotation is under way (its new keys sign): finish it with --rotate retire", "promote": "the new keys sign already"}},
		{"retire", "stage 3 of 3 (retire)", map[string]string{
			"promote": "no rotation is under way: start one with --rotate add", "retire": "no rotation is under way"}},
	} {
		out := keysRun(t, "--rotate", tc.stage, "--in", dir)
		if !strings.Contains(out, tc.want) || !strings.Contains(out, "kubectl -n prod rollout restart deployment/keyway-proxy statefulset/orders") {
			t.Errorf("--rotate %s: summary\n%s", tc.stage, out)
		}
		cur := snap(t, dir)
		// The rollout: members of both stages side by side.
		for _, a := range []snapshot{prev, cur} {
			for _, b := range []snapshot{prev, cur} {
				for _, from := range []string{"proxy", "orders"} {
					for _, to := range []string{"proxy", "orders"} {
						if !verifies(a[from], b[to]) {
							t.Errorf("--rotate %s: a %s signing as %s does not verify on a %s verifying as %s", tc.stage, from, a[from].Self(), to, b[to].Self())
						}
					}
				}
			}
		}
		for stage, want := range tc.refused {
			_, _, err := keywayCLI(t, "keys", "--rotate", stage, "--in", dir)
			if err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), want) {
				t.Errorf("--rotate %s after %s: %v, want %q", stage, tc.stage, err, want)
			}
		}
		prev = cur
	}
	// After the rotation: new keys only, and the Secrets kept their namespace.
	for _, role := range []string{"proxy", "orders"} {
		if verifies(start[role], prev["proxy"]) || verifies(start[role], prev["orders"]) {
			t.Errorf("the retired %s key still verifies", role)
		}
		if prev[role].Self().KeyID == start[role].Self().KeyID {
			t.Errorf("%s signs with its old key %s", role, start[role].Self().KeyID)
		}
	}
	if ns := secretNamespace(filepath.Join(dir, "agent-orders.secret.yaml")); ns != "prod" {
		t.Errorf("the rotated Secrets' namespace is %q, want prod (from the directory's)", ns)
	}
}

func TestKeysAddSet(t *testing.T) {
	dir := t.TempDir()
	keysRun(t, "--sets", "orders", "--out", dir)
	before := snap(t, dir)
	out := keysRun(t, "--add-set", "users", "--in", dir)
	if !strings.Contains(out, "agent keys for set users added") || !strings.Contains(out, "Every proxy needs the new public key before the first agent of users starts") ||
		!strings.Contains(out, "rollout restart deployment/keyway-proxy statefulset/orders (") {
		t.Errorf("summary:\n%s", out)
	}
	after := snap(t, dir)
	users := keyring(t, filepath.Join(dir, "agent-users.yaml"), asUsers)
	for _, role := range []string{"proxy", "orders"} {
		if after[role].Self().KeyID != before[role].Self().KeyID {
			t.Errorf("--add-set changed the %s key", role)
		}
		if !after[role].HasSet("users") || !verifies(users, after[role]) || !verifies(after[role], users) {
			t.Errorf("%s and the new set's agents do not verify each other", role)
		}
	}
	if c, _ := fleetauth.Load(filepath.Join(dir, "agent-users.yaml")); len(c.Proxy.Private) > 0 || len(c.Agents["orders"].Private) > 0 {
		t.Error("agent-users.yaml holds another role's private key")
	}
	// A set added during a rotation joins it at the next rotation.
	keysRun(t, "--rotate", "add", "--in", dir)
	keysRun(t, "--add-set", "events", "--in", dir)
	keysRun(t, "--rotate", "promote", "--in", dir)
	keysRun(t, "--rotate", "retire", "--in", dir)
	if c, _ := fleetauth.Load(filepath.Join(dir, "proxy.yaml")); len(c.Agents["events"].Public) != 1 || len(c.Agents["orders"].Public) != 1 {
		t.Errorf("after the rotation: events %d, orders %d public keys, want 1 each", len(c.Agents["events"].Public), len(c.Agents["orders"].Public))
	}
}

// --in refuses a directory whose files do not belong together.
func TestKeysInconsistentDirectory(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	keysRun(t, "--sets", "orders", "--out", a)
	keysRun(t, "--sets", "orders,users", "--out", b)
	copyFile := func(from, to string) {
		raw, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		setup func(dir string)
		want  string
	}{
		{"an agent file of another run", func(dir string) {
			copyFile(filepath.Join(b, "agent-orders.yaml"), filepath.Join(dir, "agent-orders.yaml"))
		},
			"proxy.yaml and agent-orders.yaml list different public keys"},
		{"an agent file of a set proxy.yaml does not list", func(dir string) {
			copyFile(filepath.Join(b, "agent-users.yaml"), filepath.Join(dir, "agent-users.yaml"))
		},
			"agent-users.yaml is of a set proxy.yaml does not list"},
		{"a missing agent file", func(dir string) { os.Remove(filepath.Join(dir, "agent-orders.yaml")) }, "no agent-orders.yaml"},
		{"an agent's file as the proxies'", func(dir string) { copyFile(filepath.Join(dir, "agent-orders.yaml"), filepath.Join(dir, "proxy.yaml")) },
			"proxy.yaml holds no proxy private key"},
		{"the proxies' file as an agent's", func(dir string) { copyFile(filepath.Join(dir, "proxy.yaml"), filepath.Join(dir, "agent-orders.yaml")) },
			"agent-orders.yaml holds the proxy private key"},
	} {
		dir := t.TempDir()
		for _, f := range []string{"proxy.yaml", "agent-orders.yaml"} {
			copyFile(filepath.Join(a, f), filepath.Join(dir, f))
		}
		tc.setup(dir)
		_, _, err := keywayCLI(t, "keys", "--rotate", "add", "--in", dir)
		if err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want exit 2 and %q", tc.name, err, tc.want)
		}
	}
}
