package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestResolve(t *testing.T) {
	vcs := func(kv ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "keyway", Version: "(devel)"}}
		for i := 0; i+1 < len(kv); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return bi
	}
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for name, tc := range map[string]struct {
		version, commit, date string
		bi                    *debug.BuildInfo
		want                  Info
		line                  string
	}{
		"stamped by make build": {
			version: "v1.2.0", commit: rev, date: "2026-11-30T19:00:00Z",
			bi:   vcs("vcs.revision", "ffffffffffff", "vcs.time", "2020-01-01T00:00:00Z"),
			want: Info{Version: "v1.2.0", Commit: rev, Date: "2026-11-30T19:00:00Z", GoVersion: "go1.26.8"},
			line: "keyway v1.2.0 commit 0123456789ab built 2026-11-30T19:00:00Z go1.26.8",
		},
		"go build in a checkout: what Go recorded": {
			bi:   vcs("vcs", "git", "vcs.revision", rev, "vcs.time", "2026-11-29T10:00:00Z", "vcs.modified", "true"),
			want: Info{Version: Devel, Commit: rev + "-dirty", Date: "2026-11-29T10:00:00Z", GoVersion: "go1.26.8"},
			line: "keyway (devel) commit 0123456789ab-dirty built 2026-11-29T10:00:00Z go1.26.8",
		},
		"go install at a module version": {
			bi: func() *debug.BuildInfo {
				bi := vcs()
				bi.Main.Version = "v1.3.0"
				return bi
			}(),
			want: Info{Version: "v1.3.0", GoVersion: "go1.26.8"},
			line: "keyway v1.3.0 commit unknown go1.26.8",
		},
		"go build -buildvcs=false": {
			bi:   vcs(),
			want: Info{Version: Devel, GoVersion: "go1.26.8"},
			line: "keyway (devel) commit unknown go1.26.8",
		},
		"Docker build without build arguments": {
			version: "dev",
			bi:      vcs(),
			want:    Info{Version: "dev", GoVersion: "go1.26.8"},
			line:    "keyway dev commit unknown go1.26.8",
		},
		"no build information": {
			want: Info{Version: Devel, GoVersion: runtime.Version()},
			line: "keyway (devel) commit unknown " + runtime.Version(),
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := resolve(tc.version, tc.commit, tc.date, tc.bi)
			if got != tc.want {
				t.Errorf("resolve: %+v\nwant %+v", got, tc.want)
			}
			if got.String() != tc.line {
				t.Errorf("String: %q\nwant %q", got.String(), tc.line)
			}
		})
	}
}

func TestCollector(t *testing.T) {
	i := Get()
	want := `# HELP keyway_build_info Which keyway build runs: always 1, with the version, the git commit and the Go version as labels.
# TYPE keyway_build_info gauge
keyway_build_info{commit="` + i.ShortCommit() + `",go_version="` + i.GoVersion + `",version="` + i.Version + `"} 1
`
	if err := testutil.CollectAndCompare(Collector(), strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.CollectAndLint(Collector()); err != nil || len(n) > 0 {
		t.Fatalf("lint: %v %v", n, err)
	}
}
