package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestAccessLogIsNotSampled(t *testing.T) {
	var stderr, stdout bytes.Buffer
	l, err := New(Config{Level: "info", Format: "json", AccessLog: true}, &stderr, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		l.Access.Info("access")
		l.App.Info("same message")
	}
	l.Close()
	if n := strings.Count(stdout.String(), "\n"); n != 1000 {
		t.Fatalf("access log kept %d of 1000 entries", n)
	}
	if n := strings.Count(stderr.String(), "\n"); n >= 1000 || n < 100 {
		t.Fatalf("app log kept %d of 1000 identical entries; want sampling to keep 100..999", n)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(strings.SplitN(stdout.String(), "\n", 2)[0]), &m); err != nil || m["msg"] != "access" {
		t.Fatalf("access line is not JSON with msg=access: %v %v", err, m)
	}
}

func TestLevelAndFormat(t *testing.T) {
	var stderr bytes.Buffer
	l, err := New(Config{Level: "warn", Format: "console"}, &stderr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Access != nil {
		t.Fatal("access logger built with access_log off")
	}
	l.App.Info("hidden")
	l.App.Warn("shown")
	l.Close()
	if out := stderr.String(); strings.Contains(out, "hidden") || !strings.Contains(out, "WARN") || strings.HasPrefix(out, "{") {
		t.Fatalf("unexpected console output %q", out)
	}
}

func TestValidate(t *testing.T) {
	cases := map[string]struct {
		cfg  Config
		want string
	}{
		"default":    {DefaultConfig(), ""},
		"bad level":  {Config{Level: "verbose", Format: "json"}, "level: must be one of debug, info, warn, error"},
		"bad format": {Config{Level: "info", Format: "xml"}, "format: must be json or console"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestSetLevel(t *testing.T) {
	var stderr bytes.Buffer
	l, err := New(Config{Level: "warn", Format: "json"}, &stderr, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.App.Info("hidden")
	if err := l.SetLevel("debug"); err != nil {
		t.Fatal(err)
	}
	l.App.Debug("shown")
	if err := l.SetLevel("loud"); err == nil {
		t.Fatal("SetLevel accepted an unknown level")
	}
	if l.Level() != "debug" {
		t.Fatalf("Level() = %q after a refused change, want debug", l.Level())
	}
	l.Close()
	if out := stderr.String(); strings.Contains(out, "hidden") || !strings.Contains(out, "shown") {
		t.Fatalf("log output %q: want the debug line after SetLevel and not the info line before", out)
	}
}
