package eventlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// state implements encoding.TextMarshaler, like balancer.State.
type state int

func (s state) MarshalText() ([]byte, error) { return []byte([]string{"starting", "ready"}[s]), nil }

// reason implements only fmt.Stringer.
type reason int

func (r reason) String() string { return "timeout" }

// nilStringer panics in String when nil.
type nilStringer struct{ s string }

func (n *nilStringer) String() string { return n.s }

func TestEventLineFormat(t *testing.T) {
	ts := `"ts":"2025-03-04T05:06:07.000000008Z"`
	tests := map[string]struct {
		ev   Event
		want string
	}{
		"minimal": {
			ev:   Event{Time: t0, Node: "proxy-1", Kind: KindProbeUp},
			want: `{` + ts + `,"node":"proxy-1","kind":"probe_up"}`,
		},
		"fixed keys first, fields sorted": {
			ev: Event{Time: t0, Node: "n", Kind: KindEjected, Set: "orders", Replica: "orders-0",
				Fields: map[string]any{"reason": "5xx", "backoff": 30 * time.Second, "consecutive": 5}},
			want: `{` + ts + `,"node":"n","kind":"ejected","set":"orders","replica":"orders-0","backoff":"30s","consecutive":5,"reason":"5xx"}`,
		},
		"reserved field keys never override": {
			ev: Event{Time: t0, Node: "n", Kind: "k", Replica: "r",
				Fields: map[string]any{"ts": "x", "node": "evil", "kind": "other", "set": "s", "replica": "q", "ok": true}},
			want: `{` + ts + `,"node":"n","kind":"k","replica":"r","ok":true}`,
		},
		"time in another zone written in UTC": {
			ev:   Event{Time: t0.In(time.FixedZone("CEST", 2*3600)), Node: "n", Kind: "k"},
			want: `{` + ts + `,"node":"n","kind":"k"}`,
		},
		"whole second keeps nine digits": {
			ev:   Event{Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Node: "n", Kind: "k"},
			want: `{"ts":"2025-01-02T03:04:05.000000000Z","node":"n","kind":"k"}`,
		},
		"escaping": {
			ev: Event{Time: t0, Node: "n", Kind: "k",
				Fields: map[string]any{"s": "q\"b\\n\nt\tc\x01\x7f é \xff \u2028"}},
			want: `{` + ts + `,"node":"n","kind":"k","s":"q\"b\\n\nt\tc\u0001\u007f é \ufffd \u2028"}`,
		},
		"value types": {
			ev: Event{Time: t0, Node: "n", Kind: "k", Fields: map[string]any{
				"a_nil": nil, "b_int8": int8(-3), "c_u64": uint64(math.MaxUint64), "d_float": 1.5,
				"e_big": 1e21, "f_nan": math.NaN(), "g_inf": math.Inf(-1), "h_f32": float32(0.25),
				"i_time": t0, "j_err": errors.New("dial tcp: refused"), "k_text": state(1),
				"l_stringer": reason(0), "m_list": []string{"a", "b"}, "n_map": map[string]int{"y": 2, "x": 1},
				"o_raw": json.RawMessage(`{"z": 1}`), "p_chan": make(chan int), "q_panic": (*nilStringer)(nil),
			}},
			want: `{` + ts + `,"node":"n","kind":"k","a_nil":null,"b_int8":-3,"c_u64":18446744073709551615,` +
				`"d_float":1.5,"e_big":1e+21,"f_nan":"NaN","g_inf":"-Inf","h_f32":0.25,` +
				`"i_time":"2025-03-04T05:06:07.000000008Z","j_err":"dial tcp: refused","k_text":"ready",` +
				`"l_stringer":"timeout","m_list":["a","b"],"n_map":{"x":1,"y":2},"o_raw":{"z":1},` +
				`"p_chan":"` + "%s" + `","q_panic":"!panic: runtime error: invalid memory address or nil pointer dereference"}`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := tc.ev.MarshalJSON()
			if err != nil {
				t.Fatalf("MarshalJSON: %v", err)
			}
			want := tc.want
			if c, ok := tc.ev.Fields["p_chan"]; ok {
				// A channel cannot be JSON: it is written as %v, its address.
				want = strings.Replace(want, "%s", fmt.Sprintf("%v", c), 1)
			}
			if string(got) != want {
				t.Errorf("line\n got %s\nwant %s", got, want)
			}
			if !json.Valid(got) {
				t.Errorf("not valid JSON: %s", got)
			}
			if bytes.ContainsAny(got, "\n\r") {
				t.Errorf("line contains a raw line break: %q", got)
			}
		})
	}
}

func TestEventRoundTrip(t *testing.T) {
	in := Event{
		Time: time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.UTC), Node: "proxy-1", Kind: KindRingRebuild,
		Set: "orders", Replica: "orders-2",
		Fields: map[string]any{
			"cause": "member_join", "moved": 85, "partitions": int64(271), "load": 1.25, "ok": true,
			"none": nil, "added": []string{"orders-2"}, "by_zone": map[string]any{"a": 1, "b": "x"},
		},
	}
	b, err := json.Marshal(in) // through MarshalJSON, as the admin API will
	if err != nil {
		t.Fatal(err)
	}
	var out Event
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("Unmarshal(%s): %v", b, err)
	}
	want := in
	want.Fields = map[string]any{
		"cause": "member_join", "moved": int64(85), "partitions": int64(271), "load": 1.25, "ok": true,
		"none": nil, "added": []any{"orders-2"}, "by_zone": map[string]any{"a": int64(1), "b": "x"},
	}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("round trip\n got %#v\nwant %#v", out, want)
	}

	// Without fields, Fields comes back nil; set and replica stay empty.
	in = Event{Time: t0, Node: "n", Kind: KindPhaseChange}
	b, _ = in.MarshalJSON()
	out = Event{}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Errorf("round trip without fields: got %#v, want %#v", out, in)
	}
}

func TestEventUnmarshalErrors(t *testing.T) {
	tests := map[string]struct {
		line string
		want string // error substring; "" = no error
	}{
		"ts missing":     {`{"node":"n","kind":"k"}`, `"ts" is missing`},
		"ts not string":  {`{"ts":1,"kind":"k"}`, `"ts" is missing or not a string`},
		"ts not a time":  {`{"ts":"yesterday","kind":"k"}`, "ts: "},
		"kind number":    {`{"ts":"2025-03-04T05:06:07Z","kind":3}`, `"kind" is not a string`},
		"replica object": {`{"ts":"2025-03-04T05:06:07Z","kind":"k","replica":{}}`, `"replica" is not a string`},
		"not an object":  {`[1,2]`, "cannot unmarshal"},
		"short ts ok":    {`{"ts":"2025-03-04T07:06:07+02:00","kind":"k"}`, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var e Event
			err := json.Unmarshal([]byte(tc.line), &e)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Unmarshal(%s) = %v, want nil", tc.line, err)
			case tc.want == "":
				if want := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC); !e.Time.Equal(want) || e.Time.Location() != time.UTC {
					t.Errorf("Time = %v, want %v in UTC", e.Time, want)
				}
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("Unmarshal(%s) = %v, want an error containing %q", tc.line, err, tc.want)
			}
		})
	}

	e := Event{Kind: "kept"}
	if err := json.Unmarshal([]byte("null"), &e); err != nil || e.Kind != "kept" {
		t.Errorf("Unmarshal(null) = %v, event %+v; want nil and the event unchanged", err, e)
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	a := Event{Time: t0, Node: "n", Kind: KindProbeDown, Replica: "r", Fields: map[string]any{"status": int64(500)}}
	b := Event{Time: t0.Add(time.Second), Node: "n", Kind: KindProbeUp, Replica: "r"}
	la, _ := a.MarshalJSON()
	lb, _ := b.MarshalJSON()

	good := filepath.Join(dir, "good.jsonl")
	os.WriteFile(good, []byte(string(la)+"\n\n"+string(lb)+"\n"), 0o644)
	evs, err := ReadFile(good)
	if err != nil || !reflect.DeepEqual(evs, []Event{a, b}) {
		t.Errorf("ReadFile(good) = %+v, %v; want both events", evs, err)
	}

	// A last line cut short (a crash mid-write): the events before it and
	// an error naming the line.
	cut := filepath.Join(dir, "cut.jsonl")
	os.WriteFile(cut, []byte(string(la)+"\n"+string(lb)+"\n"+string(lb[:20])), 0o644)
	evs, err = ReadFile(cut)
	if err == nil || !strings.Contains(err.Error(), "cut.jsonl:3: ") {
		t.Errorf("ReadFile(cut) error = %v, want one naming cut.jsonl:3", err)
	}
	if !reflect.DeepEqual(evs, []Event{a, b}) {
		t.Errorf("ReadFile(cut) events = %+v, want the two whole lines", evs)
	}

	if _, err := ReadFile(filepath.Join(dir, "missing.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadFile(missing) = %v, want ErrNotExist", err)
	}
}
