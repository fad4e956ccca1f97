package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A syntax error is reported at the line of the problem, not at the line
// yaml.v3 names (the start of the token it was scanning, or for a parser
// error the line before its context).
func TestSyntaxErrorLine(t *testing.T) {
	const sets = "replica_sets:\n  - name: orders\n    replicas: 2\n    static:\n      - {name: orders-0, addr: \"127.0.0.1:9001\"}\n"
	tab := "; this line is indented with a tab: YAML indents with spaces only"
	for name, tc := range map[string]struct {
		yaml string
		line int
		msg  string
	}{
		// yaml.v3 says line 3 (where "2" starts).
		"tab in a plain scalar's continuation": {"listen: \":8080\"\nadmin:\n  listen: 127.0.0.1:9901\n\ttoken_file: x\n" + sets,
			4, "found a tab character that violates indentation" + tab},
		// yaml.v3 says line 2 (where "|" starts).
		"tab in a block scalar": {"listen: \":8080\"\nlog: |\n  x\n\ty\n" + sets,
			4, "found a tab character where an indentation space is expected" + tab},
		"tab before a list entry": {"replica_sets:\n  - name: orders\n    static:\n\t- {name: orders-0, addr: \"127.0.0.1:9001\"}\n",
			4, "found character that cannot start any token" + tab},
		"tab after spaces": {"listen: \":8080\"\nadmin:\n  listen: x\n  \ttoken_file: y\n" + sets,
			4, "found a tab character that violates indentation" + tab},
		// A parser error: yaml.v3 says line 1.
		"key in a list": {"server:\n  - x\n  y: 1\n" + sets, 3, "did not find expected '-' indicator"},
		// Where yaml.v3 was right, it stays right.
		"missing colon":        {"listen: \":8080\"\nadmin\nlog: {}\n" + sets, 2, "could not find expected ':'"},
		"unclosed flow list":   {"listen: \":8080\"\ngossip: {join: [a, b}\n" + sets, 2, "did not find expected ',' or ']'"},
		"mapping in a mapping": {"listen: \":8080\"\nadmin:\n  listen: 1\n   token_file: 2\n" + sets, 4, "mapping values are not allowed in this context"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadBytes("f.yaml", []byte(tc.yaml), WithEnv(nil))
			want := fmt.Sprintf("f.yaml:%d: invalid YAML: %s", tc.line, tc.msg)
			if e, ok := errors.AsType[*Error](err); !ok || len(e.Problems) != 1 || e.Error() != want {
				t.Fatalf("got  %v\nwant %s", err, want)
			}
		})
	}
	// A tab on line N, for N from 3 to 30, in the continuation of a value
	// that starts on line N-1: always line N (yaml.v3 says N-1).
	for n := 3; n <= 30; n++ {
		var b strings.Builder
		for i := 1; i <= n-3; i++ {
			fmt.Fprintf(&b, "# comment %d\n", i)
		}
		b.WriteString("log:\n  level: info\n\tformat: json\n" + sets)
		if lines := strings.Split(b.String(), "\n"); !strings.HasPrefix(lines[n-1], "\t") {
			t.Fatalf("n=%d: the tab is not on line %d:\n%s", n, n, b.String())
		}
		_, err := LoadBytes("f.yaml", []byte(b.String()), WithEnv(nil))
		if err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("f.yaml:%d: invalid YAML: found a tab character that violates indentation", n)) {
			t.Errorf("tab on line %d: %v", n, err)
		}
	}
}
