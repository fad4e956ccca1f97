//go:build !race

package logging

import "testing"

// TestKeyHasherAllocs: the HMAC of a key costs no allocation (the race
// detector makes sync.Pool drop items, hence the build tag).
func TestKeyHasherAllocs(t *testing.T) {
	k := newKeyHasher([]byte("0123456789abcdef"))
	dst, key := make([]byte, 0, 64), []byte("customer-42")
	if n := testing.AllocsPerRun(1000, func() { dst = k.appendKey(dst[:0], key) }); n != 0 {
		t.Fatalf("%v allocations per HMAC, want 0", n)
	}
}

// TestAccessLogWriteAllocs: appending a line to the buffer costs nothing.
func TestAccessLogWriteAllocs(t *testing.T) {
	a, err := newAccessLog(accessCfg(nil), accessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	l := line(1)
	_, _ = a.Write(l) // starts the flusher
	if n := testing.AllocsPerRun(1000, func() { _, _ = a.Write(l) }); n != 0 {
		t.Fatalf("%v allocations per Write, want 0", n)
	}
}
