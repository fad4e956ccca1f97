package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"go.yaml.in/yaml/v3"
)

// addExampleSeeds adds every example configuration, and a few hostile
// fragments, to a fuzz target's seed corpus.
func addExampleSeeds(f *testing.F, add func(data []byte)) {
	f.Helper()
	files, err := filepath.Glob("../examples/*.yaml")
	if err != nil || len(files) == 0 {
		f.Fatalf("no example configurations: %v", err)
	}
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		add(data)
	}
	for _, s := range []string{
		"", "---\n", "[]", "a: b\n---\nc: d\n", "listen: :8080\nreplica_sets: []\n",
		"replica_sets:\n- name: x\n  replicas: [{addr: 127.0.0.1:1}]\n  key: [{header: X-K}]\n",
		"&a [*a]", "x: &a\n  y: *a\n", "server:\n  read_timeout: 1e400s\n", "server: {max_conns: -1}\n",
		"replica_sets: [{name: a, replicas: [{addr: \"\\x00\"}]}]\n", "\xff\xfe", "? [a]\n: b\n",
	} {
		add([]byte(s))
	}
}

// loadFuzz loads data with no environment and checks what every load
// must satisfy: an error is a *Error whose problems all say something, and
// comes with the zero Config; a configuration that loads validates.
func loadFuzz(t *testing.T, data []byte) (Config, bool) {
	t.Helper()
	c, err := LoadBytes("fuzz.yaml", data, noEnv)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || len(e.Problems) == 0 {
			t.Fatalf("error %T %v is not a *config.Error with problems", err, err)
		}
		for _, p := range e.Problems {
			if p.Message == "" {
				t.Fatalf("problem without a message: %+v", p)
			}
		}
		if !reflect.DeepEqual(c, Config{}) {
			t.Fatalf("error %v with a non-zero config", err)
		}
		return Config{}, false
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("a loaded config does not validate: %v", err)
	}
	return c, true
}

// FuzzLoadBytes feeds arbitrary bytes to the configuration loader (with
// the environment off): it never panics, fails only with a *Error, and a
// configuration it accepts round-trips: yaml.v3's encoding of it loads
// again to the same configuration.
func FuzzLoadBytes(f *testing.F) {
	addExampleSeeds(f, func(b []byte) { f.Add(b) })
	f.Fuzz(func(t *testing.T, data []byte) {
		c, ok := loadFuzz(t, data)
		if !ok {
			return
		}
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		again, err := LoadBytes("marshalled.yaml", out, noEnv)
		if err != nil {
			t.Fatalf("reloading the marshalled config: %v\n%s", err, out)
		}
		if !sameConfig(again, c) {
			t.Fatalf("round trip changed the config:\n%s\ngot  %+v\nwant %+v", out, again, c)
		}
		if d := Diff(c, again); len(d) != 0 {
			t.Fatalf("Diff of equal configs: %+v", d)
		}
	})
}

// FuzzDiff loads two fuzzed files, the input split at its first NUL byte
// (the defaults stand in for one that does not load), and diffs them, as
// a reload does: Diff never panics, Diff(a, a) is empty, every change
// names a key and differs, no key is listed twice, and two configs with no
// change between them are equal. One input split in two, so that the
// fuzzer mutates both files and where one ends.
func FuzzDiff(f *testing.F) {
	var seeds [][]byte
	addExampleSeeds(f, func(b []byte) { seeds = append(seeds, b) })
	for i := range seeds {
		f.Add(bytes.Join([][]byte{seeds[i], seeds[(i+1)%len(seeds)]}, []byte{0}))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		da, db, _ := bytes.Cut(data, []byte{0})
		a, ok := loadFuzz(t, da)
		if !ok {
			a = Default()
		}
		b, ok := loadFuzz(t, db)
		if !ok {
			b = Default()
		}
		if d := Diff(a, a); len(d) != 0 {
			t.Fatalf("Diff(a, a) = %+v", d)
		}
		d := Diff(a, b)
		seen := map[string]bool{}
		for _, c := range d {
			if c.Path == "" || c.Old == c.New || seen[c.Path] {
				t.Fatalf("bad change %+v in %+v", c, d)
			}
			seen[c.Path] = true
		}
		if len(d) == 0 && !sameConfig(a, b) {
			t.Fatalf("no change listed between different configs:\n%+v\n%+v", a, b)
		}
		if len(Diff(b, a)) != len(d) {
			t.Fatalf("Diff(a, b) and Diff(b, a) list different keys: %+v vs %+v", d, Diff(b, a))
		}
	})
}

// sameConfig is reflect.DeepEqual, except that an empty list equals an
// absent one: yaml.v3 writes a nil list as "[]", which loads as an empty
// one, and the two mean the same to every component.
func sameConfig(a, b Config) bool {
	nilEmpty(reflect.ValueOf(&a).Elem())
	nilEmpty(reflect.ValueOf(&b).Elem())
	return reflect.DeepEqual(a, b)
}

func nilEmpty(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				nilEmpty(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.Len() == 0 {
			v.SetZero()
			return
		}
		// Copy before changing elements: a and b may share the array.
		c := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		reflect.Copy(c, v)
		v.Set(c)
		for i := range v.Len() {
			nilEmpty(v.Index(i))
		}
	}
}
