package balancer

import (
	"bytes"
	"net/url"
	"strings"
	"testing"
)

func TestHashHeader(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		in     string
		status KeyStatus
		key    string
	}{
		"plain":           {"abc", KeyOK, "abc"},
		"empty":           {"", KeyMissing, ""},
		"taken as-is":     {"%61bc", KeyOK, "%61bc"},
		"spaces kept":     {" abc ", KeyOK, " abc "},
		"slash allowed":   {"a/b", KeyOK, "a/b"},
		"non-ascii bytes": {"ключ", KeyOK, "ключ"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, st := HashHeader([]byte(tc.in))
			if st != tc.status {
				t.Fatalf("status %v, want %v", st, tc.status)
			}
			checkAppend(t, tc.key, st, func(dst []byte) ([]byte, KeyStatus) { return AppendHeaderKey(dst, []byte(tc.in)) })
			if st == KeyOK && h != HashString(tc.key) {
				t.Fatalf("hash %x, want HashString(%q) = %x", h, tc.key, HashString(tc.key))
			}
			if st != KeyOK && h != 0 {
				t.Fatalf("hash %x with status %v, want 0", h, st)
			}
		})
	}
}

func TestHashPathSegment(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		path   string
		n      int
		status KeyStatus
		key    string // decoded key when status is KeyOK
	}{
		"plain":                        {"/ingest/abc", 2, KeyOK, "abc"},
		"first segment":                {"/abc", 1, KeyOK, "abc"},
		"more after":                   {"/ingest/abc/more/x", 2, KeyOK, "abc"},
		"third":                        {"/a/b/c/d", 3, KeyOK, "c"},
		"trailing slash after key":     {"/ingest/abc/", 2, KeyOK, "abc"},
		"escape decoded":               {"/ingest/%61bc", 2, KeyOK, "abc"},
		"all escaped upper and lower":  {"/ingest/%61%62%63", 2, KeyOK, "abc"},
		"escaped upper hex":            {"/ingest/%C3%A9", 2, KeyOK, "é"},
		"escaped lower hex":            {"/ingest/%c3%a9", 2, KeyOK, "é"},
		"escaped space":                {"/ingest/a%20b", 2, KeyOK, "a b"},
		"escape at end":                {"/ingest/ab%63", 2, KeyOK, "abc"},
		"plus is literal in paths":     {"/ingest/a+b", 2, KeyOK, "a+b"},
		"query ignored":                {"/ingest/abc?x=1", 2, KeyOK, "abc"},
		"query with slashes ignored":   {"/ingest/abc?next=/../%2F", 2, KeyOK, "abc"},
		"empty query":                  {"/ingest/abc?", 2, KeyOK, "abc"},
		"dots inside a key":            {"/ingest/a.b", 2, KeyOK, "a.b"},
		"three dots":                   {"/ingest/...", 2, KeyOK, "..."},
		"leading dot":                  {"/ingest/.abc", 2, KeyOK, ".abc"},
		"dot segment after key":        {"/ingest/abc/..", 2, KeyOK, "abc"},
		"escapes after key ignored":    {"/ingest/abc/%2F%zz", 2, KeyOK, "abc"},
		"dotted prefix segment":        {"/v1.2/abc", 2, KeyOK, "abc"},
		"encoded dot in prefix name":   {"/a%2Eb/abc", 2, KeyOK, "abc"},
		"other escape in prefix":       {"/in%67est/abc", 2, KeyOK, "abc"},
		"encoded NUL is a byte":        {"/ingest/a%00b", 2, KeyOK, "a\x00b"},
		"encoded slash":                {"/ingest/a%2Fb", 2, KeyInvalid, ""},
		"encoded slash lower":          {"/ingest/a%2fb", 2, KeyInvalid, ""},
		"encoded backslash":            {"/ingest/a%5Cb", 2, KeyInvalid, ""},
		"encoded backslash lower":      {"/ingest/a%5cb", 2, KeyInvalid, ""},
		"encoded dot":                  {"/ingest/a%2Eb", 2, KeyInvalid, ""},
		"encoded dot lower":            {"/ingest/%2e", 2, KeyInvalid, ""},
		"encoded percent":              {"/ingest/a%25b", 2, KeyInvalid, ""},
		"raw backslash":                {"/ingest/a\\b", 2, KeyInvalid, ""},
		"dot key":                      {"/ingest/.", 2, KeyInvalid, ""},
		"dotdot key":                   {"/ingest/..", 2, KeyInvalid, ""},
		"dot before key":               {"/ingest/./abc", 3, KeyInvalid, ""},
		"dotdot before key":            {"/ingest/../abc", 3, KeyInvalid, ""},
		"dot first":                    {"/./abc", 2, KeyInvalid, ""},
		"encoded dotdot before key":    {"/%2e%2e/abc", 2, KeyInvalid, ""},
		"half-encoded dotdot":          {"/.%2E/abc", 2, KeyInvalid, ""},
		"encoded dot segment before":   {"/ingest/%2E/abc", 3, KeyInvalid, ""},
		"dotdot before missing key":    {"/../", 2, KeyInvalid, ""},
		"encoded slash before key":     {"/a%2Fb/abc", 2, KeyInvalid, ""},
		"encoded backslash before key": {"/a%5cb/abc", 2, KeyInvalid, ""},
		"backslash before key":         {"/a\\..\\b/abc", 2, KeyInvalid, ""},
		"empty segment before key":     {"/ingest//abc", 3, KeyInvalid, ""},
		"double slash first":           {"//abc", 2, KeyInvalid, ""},
		"empty key then more":          {"/ingest//abc", 2, KeyInvalid, ""},
		"malformed escape short":       {"/ingest/%4", 2, KeyInvalid, ""},
		"malformed escape at end":      {"/ingest/abc%", 2, KeyInvalid, ""},
		"malformed escape non-hex":     {"/ingest/%zz", 2, KeyInvalid, ""},
		"malformed escape half hex":    {"/ingest/%4g", 2, KeyInvalid, ""},
		"malformed escape before '?'":  {"/ingest/ab%4?c=1", 2, KeyInvalid, ""},
		"missing segment":              {"/ingest", 2, KeyMissing, ""},
		"missing, trailing slash":      {"/ingest/", 2, KeyMissing, ""},
		"missing far":                  {"/a/b", 5, KeyMissing, ""},
		"root":                         {"/", 1, KeyMissing, ""},
		"empty path":                   {"", 1, KeyMissing, ""},
		"only query":                   {"?x=/a/b", 1, KeyMissing, ""},
		"key only in query":            {"/ingest?key=/abc", 2, KeyMissing, ""},
		"not origin-form":              {"ingest/abc", 2, KeyMissing, ""},
		"absolute-form":                {"http://h/ingest/abc", 2, KeyMissing, ""},
		"n zero":                       {"/ingest/abc", 0, KeyMissing, ""},
		"n negative":                   {"/ingest/abc", -1, KeyMissing, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, st := HashPathSegment([]byte(tc.path), tc.n)
			if st != tc.status {
				t.Fatalf("HashPathSegment(%q, %d) status %v, want %v", tc.path, tc.n, st, tc.status)
			}
			checkAppend(t, tc.key, st, func(dst []byte) ([]byte, KeyStatus) { return AppendPathSegmentKey(dst, []byte(tc.path), tc.n) })
			if st == KeyOK && h != HashString(tc.key) {
				t.Fatalf("HashPathSegment(%q, %d) = %x, want HashString(%q) = %x", tc.path, tc.n, h, tc.key, HashString(tc.key))
			}
			if st != KeyOK && h != 0 {
				t.Fatalf("hash %x with status %v, want 0", h, st)
			}
		})
	}
}

func TestHashQuery(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		query, name string
		status      KeyStatus
		key         string
	}{
		"only param":                 {"key=abc", "key", KeyOK, "abc"},
		"among others":               {"a=1&key=abc&b=2", "key", KeyOK, "abc"},
		"last":                       {"a=1&key=abc", "key", KeyOK, "abc"},
		"escape decoded":             {"key=%61bc", "key", KeyOK, "abc"},
		"plus is space":              {"key=a+b", "key", KeyOK, "a b"},
		"encoded plus":               {"key=a%2Bb", "key", KeyOK, "a+b"},
		"encoded slash allowed":      {"key=a%2Fb", "key", KeyOK, "a/b"},
		"encoded dot allowed":        {"key=%2E%2E", "key", KeyOK, ".."},
		"equals in value":            {"key=a=b", "key", KeyOK, "a=b"},
		"repeated":                   {"key=first&key=second", "key", KeyDuplicate, ""},
		"repeated, same value":       {"key=a&x=1&key=a", "key", KeyDuplicate, ""},
		"repeated: first empty":      {"key=&key=second", "key", KeyDuplicate, ""},
		"repeated: first without =":  {"key&key=second", "key", KeyDuplicate, ""},
		"repeated: first malformed":  {"key=%zz&key=abc", "key", KeyDuplicate, ""},
		"repeated other name":        {"a=1&a=2&key=abc", "key", KeyOK, "abc"},
		"repeated as another name":   {"key=abc&k%65y=x&KEY=y", "key", KeyOK, "abc"},
		"no =":                       {"key", "key", KeyMissing, ""},
		"empty value":                {"key=", "key", KeyMissing, ""},
		"absent":                     {"a=1&b=2", "key", KeyMissing, ""},
		"empty query":                {"", "key", KeyMissing, ""},
		"prefix name":                {"keys=abc", "key", KeyMissing, ""},
		"suffix name":                {"xkey=abc", "key", KeyMissing, ""},
		"name compared raw":          {"k%65y=abc", "key", KeyMissing, ""},
		"name case-sensitive":        {"KEY=abc", "key", KeyMissing, ""},
		"empty pairs skipped":        {"&&key=abc&", "key", KeyOK, "abc"},
		"malformed escape":           {"key=%4", "key", KeyInvalid, ""},
		"malformed escape non-hex":   {"key=%zz", "key", KeyInvalid, ""},
		"malformed in other ignored": {"a=%zz&key=abc", "key", KeyOK, "abc"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, st := HashQuery([]byte(tc.query), []byte(tc.name))
			if st != tc.status {
				t.Fatalf("HashQuery(%q, %q) status %v, want %v", tc.query, tc.name, st, tc.status)
			}
			checkAppend(t, tc.key, st, func(dst []byte) ([]byte, KeyStatus) { return AppendQueryKey(dst, []byte(tc.query), []byte(tc.name)) })
			if st == KeyOK && h != HashString(tc.key) {
				t.Fatalf("HashQuery(%q) = %x, want HashString(%q)", tc.query, h, tc.key)
			}
			if st == KeyOK {
				// Go's own parser agrees on the value (it reports bad
				// pairs elsewhere in the query but keeps the good ones).
				v, _ := url.ParseQuery(tc.query)
				if v.Get(tc.name) != tc.key {
					t.Fatalf("url.ParseQuery(%q).Get(%q) = %q, want %q", tc.query, tc.name, v.Get(tc.name), tc.key)
				}
			}
		})
	}
}

// checkAppend checks an Append function against its Hash function's
// status st: the same status, and the decoded key appended after what dst
// held (nothing appended unless KeyOK).
func checkAppend(t *testing.T, key string, st KeyStatus, appendKey func(dst []byte) ([]byte, KeyStatus)) {
	t.Helper()
	got, ast := appendKey([]byte("dst:"))
	want := "dst:"
	if st == KeyOK {
		want += key
	}
	if ast != st || string(got) != want {
		t.Fatalf("Append: %q %v, want %q %v", got, ast, want, st)
	}
}

// TestCanonicalKey: the same key from any source, escaped or not, hashes
// the same, so it lands on the same replica.
func TestCanonicalKey(t *testing.T) {
	t.Parallel()
	want := HashKey([]byte("abc"))
	got := map[string]func() (uint64, KeyStatus){
		"header":         func() (uint64, KeyStatus) { return HashHeader([]byte("abc")) },
		"path":           func() (uint64, KeyStatus) { return HashPathSegment([]byte("/ingest/abc"), 2) },
		"path escaped":   func() (uint64, KeyStatus) { return HashPathSegment([]byte("/ingest/%61bc"), 2) },
		"path all esc":   func() (uint64, KeyStatus) { return HashPathSegment([]byte("/ingest/%61%62%63/x"), 2) },
		"query":          func() (uint64, KeyStatus) { return HashQuery([]byte("key=abc"), []byte("key")) },
		"query escaped":  func() (uint64, KeyStatus) { return HashQuery([]byte("key=%61bc"), []byte("key")) },
		"string":         func() (uint64, KeyStatus) { return HashString("abc"), KeyOK },
		"key bytes":      func() (uint64, KeyStatus) { return HashKey([]byte("abc")), KeyOK },
		"query mixed":    func() (uint64, KeyStatus) { return HashQuery([]byte("x=1&key=a%62c"), []byte("key")) },
		"path escape ?":  func() (uint64, KeyStatus) { return HashPathSegment([]byte("/ingest/ab%63?key=zzz"), 2) },
		"header unicode": func() (uint64, KeyStatus) { return HashHeader([]byte("abc")) },
	}
	for name, f := range got {
		t.Run(name, func(t *testing.T) {
			h, st := f()
			if st != KeyOK || h != want {
				t.Fatalf("got %x %v, want %x KeyOK", h, st, want)
			}
		})
	}
	// The same holds for a non-ASCII key: raw UTF-8 in a header, escaped in
	// the path and the query.
	h1, _ := HashHeader([]byte("é/x"))
	h2, _ := HashQuery([]byte("k=%C3%A9%2Fx"), []byte("k"))
	if h1 != h2 {
		t.Fatalf("header é/x %x != query %x", h1, h2)
	}
}

// TestHashDecodedLong: keys longer than the decoder's stack buffer stream
// through the digest and hash the same as the decoded string.
func TestHashDecodedLong(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 85, 86, 255, 256, 257, 511, 512, 513, 1000, 5000} {
		key := strings.Repeat("é", n/2) + strings.Repeat("x", n%2)
		want := HashString(key)
		if h, st := HashPathSegment([]byte("/ingest/"+url.PathEscape(key)+"/tail"), 2); st != KeyOK || h != want {
			t.Fatalf("path, %d bytes: %x %v, want %x", len(key), h, st, want)
		}
		if h, st := HashQuery([]byte("a=1&key="+url.QueryEscape(key+" +")), []byte("key")); st != KeyOK || h != HashString(key+" +") {
			t.Fatalf("query, %d bytes: %x %v", len(key), h, st)
		}
		// Escapes straddling the buffer boundary.
		raw := strings.Repeat("a", n) + "%62" + strings.Repeat("c", n)
		if h, st := HashPathSegment([]byte("/"+raw), 1); st != KeyOK || h != HashString(strings.Repeat("a", n)+"b"+strings.Repeat("c", n)) {
			t.Fatalf("boundary at %d: %x %v", n, h, st)
		}
	}
}

// segmentsOf splits a raw path the way the reference check does.
func segmentsOf(path string) []string {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	return strings.Split(strings.TrimPrefix(path, "/"), "/")
}

// FuzzHashPathSegment checks that HashPathSegment never panics and that an
// accepted key is exactly net/url's decoding of the segment, holds no
// slash or backslash (encoded or not), is no dot-segment, and follows no
// dot-segment; and that AppendPathSegmentKey agrees on the status and
// appends that key. Normal test runs use the seed corpus only.
func FuzzHashPathSegment(f *testing.F) {
	for _, s := range []struct {
		p string
		n int
	}{
		{"/ingest/abc", 2}, {"/ingest/%61bc", 2}, {"/ingest/a%2Fb", 2}, {"/ingest/../abc", 3},
		{"/ingest/%2e%2E/abc", 3}, {"/ingest/%4", 2}, {"/a\\b", 1}, {"/ingest/abc?x=/%2F", 2},
		{"//abc", 2}, {"/ingest//", 2}, {"/%zz/abc", 2}, {"/ingest/%", 2}, {"", 1}, {"/", 0},
	} {
		f.Add([]byte(s.p), s.n)
	}
	f.Fuzz(func(t *testing.T, path []byte, n int) {
		h, st := HashPathSegment(path, n)
		if st != KeyOK {
			if h != 0 {
				t.Fatalf("status %v with hash %x", st, h)
			}
			checkAppend(t, "", st, func(dst []byte) ([]byte, KeyStatus) { return AppendPathSegmentKey(dst, path, n) })
			return
		}
		segs := segmentsOf(string(path))
		if !bytes.HasPrefix(path, []byte("/")) || n < 1 || n > len(segs) {
			t.Fatalf("accepted %q segment %d, which does not exist", path, n)
		}
		raw := segs[n-1]
		if l := strings.ToLower(raw); strings.Contains(l, "%2f") || strings.Contains(l, "%5c") || strings.ContainsRune(raw, '\\') {
			t.Fatalf("accepted key segment %q of %q with an (encoded) slash or backslash", raw, path)
		}
		key, err := url.PathUnescape(raw)
		if err != nil {
			t.Fatalf("accepted key segment %q that net/url cannot decode: %v", raw, err)
		}
		if key == "" || key == "." || key == ".." || strings.ContainsAny(key, "/\\") {
			t.Fatalf("accepted key %q from %q", key, path)
		}
		if h != HashString(key) {
			t.Fatalf("hash of %q is not HashString(%q)", path, key)
		}
		checkAppend(t, key, st, func(dst []byte) ([]byte, KeyStatus) { return AppendPathSegmentKey(dst, path, n) })
		for _, s := range segs[:n-1] {
			d, err := url.PathUnescape(s)
			if err == nil && (d == "" || d == "." || d == ".." || strings.ContainsAny(d, "/\\")) {
				t.Fatalf("accepted %q although segment %q before the key normalises away", path, s)
			}
		}
	})
}

func BenchmarkHashHeader(b *testing.B) {
	v := []byte("tenant-000042")
	b.ReportAllocs()
	var sink uint64
	for b.Loop() {
		h, _ := HashHeader(v)
		sink += h
	}
	_ = sink
}

func BenchmarkHashPathSegment(b *testing.B) {
	p := []byte("/ingest/tenant-000042/events?source=web")
	b.ReportAllocs()
	var sink uint64
	for b.Loop() {
		h, _ := HashPathSegment(p, 2)
		sink += h
	}
	_ = sink
}

func BenchmarkHashPathSegmentEscaped(b *testing.B) {
	p := []byte("/ingest/tenant%2D000042%20eu/events?source=web")
	b.ReportAllocs()
	var sink uint64
	for b.Loop() {
		h, _ := HashPathSegment(p, 2)
		sink += h
	}
	_ = sink
}

func BenchmarkHashQuery(b *testing.B) {
	q := []byte("source=web&key=tenant%2D000042+eu&ts=1700000000")
	name := []byte("key")
	b.ReportAllocs()
	var sink uint64
	for b.Loop() {
		h, _ := HashQuery(q, name)
		sink += h
	}
	_ = sink
}

// BenchmarkAppendKey is the access log's extraction of the key it logs.
func BenchmarkAppendKey(b *testing.B) {
	dst := make([]byte, 0, 64)
	for name, f := range map[string]func() ([]byte, KeyStatus){
		"path_segment_escaped": func() ([]byte, KeyStatus) {
			return AppendPathSegmentKey(dst[:0], []byte("/ingest/tenant%2D000042%20eu/events?source=web"), 2)
		},
		"query": func() ([]byte, KeyStatus) {
			return AppendQueryKey(dst[:0], []byte("source=web&key=tenant%2D000042+eu&ts=1700000000"), []byte("key"))
		},
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				dst, _ = f()
			}
		})
	}
}
