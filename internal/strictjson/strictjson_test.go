package strictjson

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, ok := range []string{
		`{}`,
		` {"replicas": 5} ` + "\n",
		`{"a": {"b": 1}, "c": {"b": 2}, "d": [{"x": 1}, {"x": 2}]}`, // the same key in different objects
		`{"a": "{\"a\": 1, \"a\": 2}"}`,                             // inside a string, not a key
	} {
		if err := Check([]byte(ok)); err != nil {
			t.Errorf("Check(%s): %v", ok, err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{`{"replicas":5}{"stop":true} junk`, `unexpected data after the JSON object, at byte 14: "{\"stop\":true} junk"`},
		{`{"replicas":5} junk`, `at byte 15: "junk"`},
		{`{"replicas":5}}`, `unexpected data after the JSON object`},
		{`{"replicas":5,"replicas":6}`, `key "replicas" is given twice: write each key once`},
		{`{"match":{"path_prefix":"/a","path_prefix":"/b"}}`, `key "match.path_prefix" is given twice`},
		{`{"static":[{"name":"a"},{"name":"b","name":"c"}]}`, `key "static[1].name" is given twice`},
		{``, "the body is empty"},
		{`  `, "the body is empty"},
		{`[1]`, "the body is an array, not a JSON object"},
		{`5`, "the body is a number, not a JSON object"},
		{`null`, "the body is null, not a JSON object"},
		{`{"replicas":5`, "the JSON ends early"},
		{`{"replicas":}`, "invalid JSON at byte"},
		{`{"a":` + strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1) + `}`, "nest deeper than"},
	} {
		err := Check([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%s): %v; want an error containing %s", tc.in, err, tc.want)
		}
	}
}

func TestDecode(t *testing.T) {
	type patch struct {
		Replicas *int  `json:"replicas"`
		Stop     *bool `json:"stop"`
	}
	var p patch
	if err := Decode([]byte(`{"replicas": 5, "stop": true}`), &p); err != nil || *p.Replicas != 5 || !*p.Stop {
		t.Fatalf("Decode: %+v, %v", p, err)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"replica": 5}`, `unknown key "replica"`},
		{`{"replicas": "five"}`, `replicas: want an integer, got a JSON string`},
		{`{"stop": 1}`, `stop: want true or false, got a JSON number`},
		{`{"replicas":5}{"stop":true} junk`, `unexpected data after the JSON object`},
		{`{"replicas":5,"replicas":6}`, `key "replicas" is given twice`},
	} {
		var p patch
		err := Decode([]byte(tc.in), &p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Decode(%s): %v; want an error containing %s", tc.in, err, tc.want)
		}
	}
}
