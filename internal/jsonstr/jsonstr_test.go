package jsonstr

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAppendEscaped(t *testing.T) {
	cases := map[string]struct {
		in, want string
		max      int
	}{
		"plain":          {"abc", "abc", 10},
		"empty":          {"", "", 10},
		"quote":          {`a"b\c`, `a\"b\\c`, 10},
		"controls":       {"\x00\n\r\t\x1f\x7f", `\u0000\n\r\t\u001f\u007f`, 10},
		"invalid":        {"a\xffb\xc3", `a\ufffdb\ufffd`, 10},
		"surrogate":      {"\xed\xa0\x80", `\ufffd\ufffd\ufffd`, 10},
		"js":             {"\u2028\u2029", `\u2028\u2029`, 10},
		"utf8 kept":      {"é😀", "é😀", 10},
		"cut":            {"abcdef", "abc", 3},
		"cut to nothing": {"abc", "", 0},
		"negative max":   {"abc", "", -1},
		"cut at rune":    {"aé", "a", 2},
		"cut at emoji":   {"ab😀", "ab", 5},
		"cut in invalid": {"a\x80\x80\x80\x80b", `a\ufffd\ufffd\ufffd`, 4},
		"cut escaped":    {"\n\n\nabc", `\n\n\n`, 3},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, cut := AppendEscaped([]byte("x"), tc.in, tc.max)
			if string(got) != "x"+tc.want || cut != (len(tc.in) > max(tc.max, 0)) {
				t.Fatalf("AppendEscaped(%q, %d) = %q %v, want %q", tc.in, tc.max, got, cut, tc.want)
			}
			gotB, _ := AppendEscaped([]byte("x"), []byte(tc.in), tc.max)
			if !bytes.Equal(got, gotB) {
				t.Fatalf("string and []byte differ: %q, %q", got, gotB)
			}
			q, qcut := AppendCut(nil, tc.in, tc.max)
			if string(q) != `"`+tc.want+`"` || qcut != cut {
				t.Fatalf("AppendCut(%q, %d) = %q %v", tc.in, tc.max, q, qcut)
			}
		})
	}
}

func TestAppend(t *testing.T) {
	if got := string(Append([]byte("k:"), "a\"\n\xff")); got != `k:"a\"\n\ufffd"` {
		t.Fatalf("Append = %s", got)
	}
	long := strings.Repeat("é", 1000)
	if got := Append(nil, long); string(got) != `"`+long+`"` {
		t.Fatalf("Append cut a long string: %d bytes", len(got))
	}
}

func TestAppendNoAllocs(t *testing.T) {
	buf := make([]byte, 0, 256)
	s := "path/with \"quotes\", \x01 controls, é, \xff and \u2028"
	b := []byte(s)
	n := testing.AllocsPerRun(100, func() {
		buf = Append(buf[:0], s)
		buf, _ = AppendCut(buf, b, 20)
		buf, _ = AppendEscaped(buf, b, len(b))
	})
	if n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}

// FuzzAppendJSONString: any bytes, cut anywhere, make a valid JSON string
// that decodes to the input's first bytes (all of them when not cut) when
// the input is valid UTF-8; the string and []byte forms agree.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "a", "\"\\", "\x00\xff", "\u2028", "é😀", "\xed\xa0\x80", "\x7f\n"} {
		f.Add([]byte(s), uint16(len(s)))
		f.Add([]byte(s), uint16(1))
	}
	f.Fuzz(func(t *testing.T, in []byte, m uint16) {
		max := int(m)
		out, cut := AppendCut(nil, in, max)
		if outS, cutS := AppendCut(nil, string(in), max); !bytes.Equal(out, outS) || cut != cutS {
			t.Fatalf("%q: []byte %q, string %q", in, out, outS)
		}
		if cut != (len(in) > max) {
			t.Fatalf("%q cut at %d: cut %v", in, max, cut)
		}
		if bytes.ContainsAny(out, "\n\r\u2028\u2029") {
			t.Fatalf("%q -> %q spans lines", in, out)
		}
		var s string
		if err := json.Unmarshal(out, &s); err != nil {
			t.Fatalf("%q -> %q: %v", in, out, err)
		}
		if !utf8.Valid(in) {
			return
		}
		if !cut && s != string(in) {
			t.Fatalf("%q -> %q -> %q", in, out, s)
		}
		if cut && (!strings.HasPrefix(string(in), s) || len(s) > max || len(s) < max-(utf8.UTFMax-1)) {
			t.Fatalf("%q cut at %d -> %q", in, max, s)
		}
	})
}

func BenchmarkAppend(b *testing.B) {
	cases := map[string]string{
		"ascii":   "/ingest/orders/2024/10/05/customer-1234567890?region=eu-west-1",
		"escapes": "a \"quoted\" path\\with\ttabs\nand newlines",
		"utf8":    "/ingest/größe/日本語/emoji-😀",
	}
	for name, s := range cases {
		b.Run(name, func(b *testing.B) {
			buf := make([]byte, 0, 256)
			b.SetBytes(int64(len(s)))
			b.ReportAllocs()
			for b.Loop() {
				buf = Append(buf[:0], s)
			}
		})
	}
}
