package balancer

import (
	"bytes"
	"net/url"
	"testing"
)

// FuzzHashQuery checks HashQuery against net/url on arbitrary query
// strings and names: a name (compared raw) in two pairs or more is
// KeyDuplicate; else the pair named name decides: its value, decoded as
// net/url's QueryUnescape does, is the key, a value it cannot decode is
// KeyInvalid, and an empty or absent one KeyMissing.
// AppendQueryKey agrees: the same status, and the decoded key.
func FuzzHashQuery(f *testing.F) {
	for _, s := range [][2]string{
		{"key=abc", "key"}, {"a=1&key=%61bc", "key"}, {"key=&key=abc", "key"}, {"key", "key"},
		{"key=a+b%2Fc", "key"}, {"key=%4", "key"}, {"key=%zz", "key"}, {"k%65y=abc", "key"},
		{"&&key==", "key"}, {"x=1;key=2", "key"}, {"", ""}, {"=v", ""},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, query, name []byte) {
		h, st := HashQuery(query, name)
		if st != KeyOK && h != 0 {
			t.Fatalf("status %v with hash %x", st, h)
		}
		want, wantSt := KeyMissing, ""
		n := 0
		for _, pair := range bytes.Split(query, []byte("&")) {
			k, v, _ := bytes.Cut(pair, []byte("="))
			if !bytes.Equal(k, name) {
				continue
			}
			if n++; n > 1 {
				want, wantSt = KeyDuplicate, ""
				break
			}
			if len(v) == 0 {
				continue
			}
			key, err := url.QueryUnescape(string(v))
			if err != nil {
				want = KeyInvalid
				continue
			}
			want, wantSt = KeyOK, key
		}
		if st != want {
			t.Fatalf("HashQuery(%q, %q) = %v, want %v", query, name, st, want)
		}
		if st == KeyOK && h != HashString(wantSt) {
			t.Fatalf("HashQuery(%q, %q) is not HashString(%q)", query, name, wantSt)
		}
		checkAppend(t, wantSt, st, func(dst []byte) ([]byte, KeyStatus) { return AppendQueryKey(dst, query, name) })
	})
}

// FuzzKeySources checks that every source hashes one key alike: a header
// holding it, a query value and a path segment escaped by net/url all
// give HashString(key) when they accept it, and append the key itself. The path segment may reject a
// key (a dot-segment, or an escaped slash, backslash, dot or percent
// sign), never hash it differently.
func FuzzKeySources(f *testing.F) {
	for _, k := range []string{"abc", "a b", "a/b", "a\\b", "..", ".", "100%", "ü", "a+b", "a?b", "a&b=c", "a#b", ""} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := HashString(key)
		if want != HashKey([]byte(key)) {
			t.Fatalf("HashString(%q) != HashKey", key)
		}
		h, st := HashHeader([]byte(key))
		if (key == "") != (st == KeyMissing) || (st == KeyOK && h != want) || st == KeyInvalid {
			t.Fatalf("HashHeader(%q) = %x, %v", key, h, st)
		}
		h, st = HashQuery([]byte("a=1&key="+url.QueryEscape(key)+"&other=key"), []byte("key"))
		if (key == "" && st != KeyMissing) || (key != "" && (st != KeyOK || h != want)) {
			t.Fatalf("HashQuery of %q = %x, %v", key, h, st)
		}
		path := "/ingest/" + url.PathEscape(key) + "/more?key=x"
		h, st = HashPathSegment([]byte(path), 2)
		checkAppend(t, key, st, func(dst []byte) ([]byte, KeyStatus) { return AppendPathSegmentKey(dst, []byte(path), 2) })
		switch {
		case st == KeyOK && h != want:
			t.Fatalf("HashPathSegment(%q) hashes %q differently", path, key)
		case st == KeyMissing && key != "":
			t.Fatalf("HashPathSegment(%q) misses key %q", path, key)
		case st != KeyOK && bytes.IndexAny([]byte(key), "/\\.%") < 0 && key != "":
			t.Fatalf("HashPathSegment(%q) = %v for a plain key %q", path, st, key)
		}
	})
}
