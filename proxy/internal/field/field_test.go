package field

import (
	"bytes"
	"slices"
	"testing"
)

// fieldOfByLowerCase is Of written plainly: both names in lower case
// (ASCII letters only), then compared. Of compares byte by byte
// (EqualFold) and must agree with it on any name. (bytes.EqualFold,
// which Of used before, does not: it takes two bytes that are not
// UTF-8 for equal, and the Kelvin sign for a K. keyway's callers pass only
// token names, so that never showed.)
func fieldOfByLowerCase(name, pressure []byte) Set {
	// Byte by byte, lower case for A-Z only: header names fold ASCII
	// letters and nothing else.
	lower := func(b []byte) []byte {
		out := slices.Clone(b)
		for i, c := range out {
			if 'A' <= c && c <= 'Z' {
				out[i] = c + 'a' - 'A'
			}
		}
		return out
	}
	eq := func(a, b []byte) bool { return bytes.Equal(lower(a), lower(b)) }
	var f Set
	for i, n := range HopNames {
		if eq(name, n) {
			f = 1 << i
		}
	}
	for _, c := range []struct {
		n []byte
		f Set
	}{{[]byte("expect"), Expect}, {[]byte("x-forwarded-for"), XFF}, {[]byte("x-request-id"), RequestID}, {[]byte("x-forwarded-proto"), XFProto}, {[]byte("x-forwarded-host"), XFHost}, {[]byte("content-length"), ContentLength}} {
		if eq(name, c.n) {
			f = c.f
		}
	}
	if len(name) > 0 && eq(name, pressure) {
		f |= Pressure
	}
	return f
}

// TestFieldOfAsLowerCase: every field name, in every case of each letter,
// and with each byte changed to each of the bytes that fold near it.
func TestFieldOfAsLowerCase(t *testing.T) {
	names := append(slices.Clone(HopNames), []byte("Expect"), []byte("X-Forwarded-For"), []byte("X-Request-Id"), []byte("X-Forwarded-Proto"), []byte("X-Forwarded-Host"), []byte("Content-Length"))
	pressure := []byte("X-Replica-Pressure")
	check := func(name []byte) {
		t.Helper()
		if got, want := Of(name, pressure), fieldOfByLowerCase(name, pressure); got != want {
			t.Errorf("Of(%q) = %b, the lower-case comparison says %b", name, got, want)
		}
	}
	for _, n := range append(names, pressure) {
		for i := range n {
			for _, b := range []byte{n[i] ^ 0x20, n[i] ^ 0x01, n[i] | 0x20, n[i] &^ 0x20, '-', '_', 0, 0x80, 0xff, '\r'} {
				v := slices.Clone(n)
				v[i] = b
				check(v)
				check(bytes.ToUpper(v))
				check(v[:i])
				check(append(slices.Clone(v), 'x'))
			}
		}
		check(bytes.ToUpper(n))
		check(bytes.ToLower(n))
	}
	for _, n := range []string{"", "T", "t", "te", "TE", "Te:", "Host", "X-Key", "Content-Type", "Content-Lengt", "Content-Length ", "Keep-Alivf"} {
		check([]byte(n))
	}
}

func FuzzFieldOf(f *testing.F) {
	for _, n := range []string{"Connection", "content-length", "X-REQUEST-ID", "Proxy-Authorization", "Te", "Upgrade", "\u212aeep-Alive"} {
		f.Add([]byte(n), []byte("X-Pressure"))
	}
	f.Fuzz(func(t *testing.T, name, pressure []byte) {
		if got, want := Of(name, pressure), fieldOfByLowerCase(name, pressure); got != want {
			t.Fatalf("Of(%q, %q) = %b, the lower-case comparison says %b", name, pressure, got, want)
		}
	})
}

// TestHopFields: Hop has a bit for each hop-by-hop header and no
// other, so that a message without them skips the stripping whole.
func TestHopFields(t *testing.T) {
	if want := Set(1)<<len(HopNames) - 1; Hop != want {
		t.Fatalf("Hop = %#x, want %#x (one bit per HopNames entry)", Hop, want)
	}
	for i, name := range HopNames {
		if f := Of(name, nil); f != 1<<i || f&Hop == 0 {
			t.Errorf("Of(%s) = %#x, want bit %d, within Hop", name, f, i)
		}
	}
	for _, name := range []string{"Expect", "X-Forwarded-For", "X-Request-Id", "Content-Length"} {
		if f := Of([]byte(name), nil); f&Hop != 0 {
			t.Errorf("Of(%s) = %#x, inside Hop", name, f)
		}
	}
}

// TestName: each field's name, found by Of as that field.
func TestName(t *testing.T) {
	for i := range 15 {
		f := Set(1) << i
		if got := Of(Name(f), nil); got != f {
			t.Errorf("Of(Name(%#x) = %q) = %#x", f, Name(f), got)
		}
	}
	if Name(Pressure) != nil {
		t.Errorf("Name(Pressure) = %q, want none: each set names its own", Name(Pressure))
	}
}
