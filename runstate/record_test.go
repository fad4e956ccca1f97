package runstate

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A restart record is typed in Go and keyed "restart:" + set on the wire
// and in the state file, as proxies of older versions read it.
func TestRecordWireKey(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		rec  Record
		wire string
	}{
		{Record{Kind: KindRestart, Set: "orders", Version: 7, Origin: "edge-a", Restart: json.RawMessage(`{"state":"running"}`), Action: "restart", At: at},
			`{"set":"restart:orders","version":7,"origin":"edge-a","restart":{"state":"running"},"action":"restart","at":"2026-01-02T03:04:05Z"}`},
		{Record{Kind: KindSet, Set: "orders", Version: 8, Origin: "edge-a", Stopped: ptr(true), Action: "stop", At: at},
			`{"set":"orders","version":8,"origin":"edge-a","stopped":true,"action":"stop","at":"2026-01-02T03:04:05Z"}`},
	} {
		b, err := json.Marshal(tc.rec)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.wire {
			t.Fatalf("%s record encodes as\n%s, want\n%s", tc.rec.Kind, b, tc.wire)
		}
		var back Record
		if err := json.Unmarshal([]byte(tc.wire), &back); err != nil {
			t.Fatal(err)
		}
		if back.Kind != tc.rec.Kind || back.Set != tc.rec.Set || back.Version != tc.rec.Version || back.Action != tc.rec.Action {
			t.Fatalf("%s decodes as %+v, want %+v", tc.wire, back, tc.rec)
		}
	}
	// In a slice and through a pointer, as messages and the file hold them.
	var recs []Record
	if err := json.Unmarshal([]byte(`[{"set":"restart:orders","version":3},{"set":"users","version":4}]`), &recs); err != nil {
		t.Fatal(err)
	}
	if recs[0].Key() != (Key{KindRestart, "orders"}) || recs[1].Key() != (Key{KindSet, "users"}) {
		t.Fatalf("decoded keys %v, %v", recs[0].Key(), recs[1].Key())
	}
	b, _ := json.Marshal(&recs[0])
	if !strings.Contains(string(b), `"set":"restart:orders"`) {
		t.Fatalf("through a pointer: %s", b)
	}
}

// Records of an older proxy (a restart keyed "restart:orders") merge as a
// typed restart record; the digest over them is the one the older proxy
// computes (its set field, version, origin, time), so that the two do not
// exchange records forever during a rolling upgrade; the state file keeps
// the older key.
func TestRecordsOfAnOlderProxy(t *testing.T) {
	dir := t.TempDir()
	net := newRuntimeNet(t)
	a := net.add("a", dir, nil)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	old := `{"kind":"runtime_records","node":"old.1","digest":"x","records":[` +
		`{"set":"orders","version":4,"origin":"old","stopped":true,"action":"stop","at":"2026-01-02T03:04:05Z"},` +
		`{"set":"restart:orders","version":5,"origin":"old","restart":{"set":"orders","state":"running"},"action":"restart","at":"2026-01-02T03:04:05Z"}]}`
	a.handle("old.1", []byte(old))
	rst, ok := a.Get(KindRestart, "orders")
	if !ok || rst.Version != 5 || string(rst.Restart) != `{"set":"orders","state":"running"}` {
		t.Fatalf("restart record %+v %v", rst, ok)
	}
	if set, ok := a.Get(KindSet, "orders"); !ok || set.Version != 4 || !*set.Stopped {
		t.Fatalf("set record %+v %v", set, ok)
	}
	// The older proxy's digest: sha256 over its records sorted by key.
	h := sha256.New()
	for _, r := range []struct {
		key string
		v   int
	}{{"orders", 4}, {"restart:orders", 5}} {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00%d\x00", r.key, r.v, "old", at.UnixNano())
	}
	if want := hex.EncodeToString(h.Sum(nil)[:8]); a.Digest() != want {
		t.Fatalf("digest %s, an older proxy's over the same records %s", a.Digest(), want)
	}
	b, err := os.ReadFile(filepath.Join(dir, runtimeFileName))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"format":1`) || !strings.Contains(string(b), `"set":"restart:orders"`) {
		t.Fatalf("state file:\n%s", b)
	}
	// And this proxy's records go out in the older form.
	net.add("b", "", nil)
	if _, err := a.Update(KindRestart, "users", put(Record{Restart: []byte(`{}`), Action: "restart"})); err != nil {
		t.Fatal(err)
	}
	net.mu.Lock()
	sent := string(net.queue[len(net.queue)-1].msg)
	net.mu.Unlock()
	if !strings.Contains(sent, `"set":"restart:users"`) {
		t.Fatalf("sent %s", sent)
	}
}

// A state file of format 1 written by an older version loads, restart
// records typed.
func TestStateFileOfAnOlderVersion(t *testing.T) {
	dir := t.TempDir()
	file := `{"format":1,"records":[` +
		`{"set":"orders","version":2,"origin":"edge-a","deleted":true,"action":"delete","at":"2026-01-02T03:04:05Z"},` +
		`{"set":"restart:users","version":3,"origin":"edge-a","restart":{"state":"done"},"action":"restart","at":"2026-01-02T03:04:05Z"}]}`
	if err := os.WriteFile(filepath.Join(dir, runtimeFileName), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := r.Get(KindSet, "orders"); !ok || !got.Deleted {
		t.Fatalf("tombstone %+v %v", got, ok)
	}
	if got, ok := r.Get(KindRestart, "users"); !ok || got.Version != 3 {
		t.Fatalf("restart %+v %v", got, ok)
	}
	if _, ok := r.Get(KindSet, "users"); ok {
		t.Fatal("the restart record of users read as the set's")
	}
}
