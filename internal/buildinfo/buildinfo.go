// Package buildinfo says which keyway a binary is: its version, commit and
// build date, stamped at build time by `make build` and the Dockerfile:
//
//	go build -ldflags "-X keyway/internal/buildinfo.version=v1.2.0 \
//	  -X keyway/internal/buildinfo.commit=$(git rev-parse HEAD) \
//	  -X keyway/internal/buildinfo.date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" ./cmd/keyway
//
// A binary built without them (go build, go run, go install) falls back to
// what the Go toolchain recorded (runtime/debug.ReadBuildInfo): the module
// version for `go install keyway/cmd/keyway@v1.2.0`, and the VCS revision
// and commit time when built inside a git checkout with -buildvcs on.
//
// `keyway version` prints it, and the proxy's and the agent's /metrics
// export it as keyway_build_info{version,commit,go_version} 1.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Stamped with -ldflags -X (see the package comment); empty when not.
var (
	version string
	commit  string
	date    string
)

// Devel is the version of a binary that was neither stamped nor installed
// at a module version.
const Devel = "(devel)"

// Info is what a binary knows about its build. The zero value means
// nothing is known.
type Info struct {
	// Version is the release ("v1.2.0", or `git describe` output such as
	// "v1.2.0-3-gabc1234-dirty"), or Devel.
	Version string
	// Commit is the git commit hash, with "-dirty" when the tree had
	// uncommitted changes; "" when unknown.
	Commit string
	// Date is when the binary was built (stamped), or else the commit's
	// time, RFC 3339; "" when unknown.
	Date string
	// GoVersion is the toolchain that built it, e.g. "go1.26.8".
	GoVersion string
}

// Get returns this binary's build information. Safe for concurrent use.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, date, bi)
}

// resolve prefers the stamped values and fills in the rest from bi (nil
// when the binary has no build information).
func resolve(version, commit, date string, bi *debug.BuildInfo) Info {
	i := Info{Version: version, Commit: commit, Date: date, GoVersion: runtime.Version()}
	if bi == nil {
		if i.Version == "" {
			i.Version = Devel
		}
		return i
	}
	if bi.GoVersion != "" {
		i.GoVersion = bi.GoVersion
	}
	if i.Version == "" && bi.Main.Version != "" {
		i.Version = bi.Main.Version
	}
	if i.Version == "" {
		i.Version = Devel
	}
	var rev, at string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if i.Commit == "" && rev != "" {
		i.Commit = rev
		if dirty {
			i.Commit += "-dirty"
		}
	}
	if i.Date == "" {
		i.Date = at
	}
	return i
}

// ShortCommit is the commit's first 12 hex digits (keeping a "-dirty"
// suffix), or "unknown".
func (i Info) ShortCommit() string {
	if i.Commit == "" {
		return "unknown"
	}
	hash, dirty := strings.CutSuffix(i.Commit, "-dirty")
	if len(hash) > 12 {
		hash = hash[:12]
	}
	if dirty {
		hash += "-dirty"
	}
	return hash
}

// String is the line `keyway version` prints, e.g.
//
//	keyway v1.2.0 commit 0123456789ab built 2026-11-30T19:00:00Z go1.26.8
//
// leaving out the date when unknown.
func (i Info) String() string {
	s := "keyway " + i.Version + " commit " + i.ShortCommit()
	if i.Date != "" {
		s += " built " + i.Date
	}
	return s + " " + i.GoVersion
}

// Collector returns the keyway_build_info gauge: always 1, its labels say
// which build runs (version, commit as ShortCommit, go_version), so that
// dashboards can tell the versions of a fleet apart during a rollout.
func Collector() prometheus.Collector {
	i := Get()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "keyway_build_info",
		Help: "Which keyway build runs: always 1, with the version, the git commit and the Go version as labels.",
		ConstLabels: prometheus.Labels{
			"version": i.Version, "commit": i.ShortCommit(), "go_version": i.GoVersion,
		},
	}, func() float64 { return 1 })
}
