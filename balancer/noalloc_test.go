//go:build !race

package balancer

import "testing"

// The race detector allocates on its own, so these guards run only in
// normal builds. They prove "allocates nothing" instead of promising it;
// each has a Benchmark twin reporting allocations.

func assertNoAllocs(t *testing.T, name string, f func()) {
	t.Helper()
	if n := testing.AllocsPerRun(1000, f); n != 0 {
		t.Errorf("%s allocated %v times per run, want 0", name, n)
	}
}

func TestKeyHashingNoAllocs(t *testing.T) {
	hdr := []byte("tenant-42")
	plain := []byte("/ingest/tenant-42/events?x=1")
	escaped := []byte("/ingest/ten%61nt%2D42/events")
	query := []byte("a=1&key=ten%61nt+42&b=2")
	name := []byte("key")
	var sink uint64
	assertNoAllocs(t, "HashHeader", func() { h, _ := HashHeader(hdr); sink += h })
	assertNoAllocs(t, "HashPathSegment", func() { h, _ := HashPathSegment(plain, 2); sink += h })
	assertNoAllocs(t, "HashPathSegment escaped", func() { h, _ := HashPathSegment(escaped, 2); sink += h })
	assertNoAllocs(t, "HashQuery", func() { h, _ := HashQuery(query, name); sink += h })
	assertNoAllocs(t, "HashQuery plain", func() { h, _ := HashQuery([]byte("key=abc"), name); sink += h })
	_ = sink
	// The Append functions allocate nothing either when dst has room.
	dst := make([]byte, 0, 64)
	assertNoAllocs(t, "AppendHeaderKey", func() { dst, _ = AppendHeaderKey(dst[:0], hdr) })
	assertNoAllocs(t, "AppendPathSegmentKey", func() { dst, _ = AppendPathSegmentKey(dst[:0], escaped, 2) })
	assertNoAllocs(t, "AppendQueryKey", func() { dst, _ = AppendQueryKey(dst[:0], query, name) })
}

func TestTableNoAllocs(t *testing.T) {
	r := newTestRouter(t, RouterConfig{Hash: DefaultHashConfig()}, nil)
	r.SetReplicas("static", readyReplicas(10))
	r.SetHealthy("orders-003", false)
	hashes := keyHashes(3, 1024)
	tbl := r.Table()
	i := 0
	var sink int
	assertNoAllocs(t, "Table.Pick", func() { s, _ := tbl.Pick(hashes[i%len(hashes)]); sink += s; i++ })
	assertNoAllocs(t, "Table.Candidates", func() { sink += len(tbl.Candidates(hashes[i%len(hashes)])); i++ })
	assertNoAllocs(t, "Table.Owner", func() { sink += tbl.Owner(hashes[i%len(hashes)]); i++ })
	assertNoAllocs(t, "Table.NextRoundRobin", func() { s, _ := tbl.NextRoundRobin(); sink += s })
	assertNoAllocs(t, "Table.RandomSlot", func() { s, _ := tbl.RandomSlot(); sink += s })
	assertNoAllocs(t, "Router.Table", func() { sink += r.Table().Len() })
	assertNoAllocs(t, "hot path", func() {
		h, _ := HashHeader([]byte("tenant-42"))
		t := r.Table()
		if s, ok := t.Pick(h); ok {
			sink += len(t.Replica(s).Addr)
			_ = t.Backend(s)
		}
	})
	_ = sink
}
