package runstate

import (
	"encoding/json"
	"testing"
)

// FuzzMessage feeds arbitrary bytes to the run-time state's handlers, as
// another proxy's message (the signature checked, the body anything): no
// panic, and a record that decodes re-encodes to itself.
func FuzzMessage(f *testing.F) {
	for _, b := range []string{
		`{"kind":"runtime_digest","node":"p2","digest":"00"}`,
		`{"kind":"runtime_records","node":"p2","digest":"x","reply":true,"records":[{"set":"orders","version":3,"origin":"p2"},{"set":""}]}`,
		`{"kind":"runtime_records","node":"p2","records":[{"set":"restart:orders","version":18446744073709551615,"origin":"p2"},{"set":"restart:"}]}`,
		`{"kind":"runtime_records","records":[{"set":"orders","version":-1}]}`,
		`{"kind":1}`, `[]`, "\xff",
	} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rt, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		rt.self = func() string { return "p1" }
		rt.sendFn = func(string, []byte, bool) error { return nil }
		rt.proxies = func() []string { return []string{"p2"} }
		rt.handle("p2", b)
		rt.sends.Wait()
		_ = rt.Digest()
		for _, rec := range rt.Records() {
			enc, err := json.Marshal(rec)
			if err != nil {
				t.Fatal(err)
			}
			var back Record
			if err := json.Unmarshal(enc, &back); err != nil || back.Key() != rec.Key() || back.Version != rec.Version {
				t.Fatalf("record %+v re-decodes as %+v, %v", rec, back, err)
			}
		}
	})
}
