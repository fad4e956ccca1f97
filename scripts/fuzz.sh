#!/usr/bin/env bash
# Runs each fuzz target (package:Target) for FUZZTIME, one at a time
# (go test fuzzes one target per run). Called by `make fuzz`.
#
# A target fails when it finds an input that fails: go test writes it to
# PKG/testdata/fuzz/Target/, where it stays as a regression seed that
# `go test ./...` replays. Go 1.26's fuzz coordinator can also fail a run
# at the end of -fuzztime with a bare "context deadline exceeded" and no
# input written (golang/go#75804, fixed in Go 1.27). Such a run is
# reported as a harness failure, the target's corpus is replayed to be
# sure, and the target is fuzzed once more; only a second bare failure,
# or any written input, fails `make fuzz`.
set -u
fuzztime=${FUZZTIME:-5m}
minimize=${FUZZMINIMIZE:-5s}
failed=0
for t in "$@"; do
	pkg=${t%%:*} target=${t#*:}
	dir="$pkg/testdata/fuzz/$target"
	for attempt in 1 2; do
		before=$(ls "$dir" 2>/dev/null | sort)
		echo "== $target ($pkg, $fuzztime, attempt $attempt) $(date -u +%H:%M:%S)"
		out=$(mktemp)
		go test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "$pkg" 2>&1 | tee "$out"
		rc=${PIPESTATUS[0]}
		after=$(ls "$dir" 2>/dev/null | sort)
		if [ "$rc" -eq 0 ]; then
			rm -f "$out"
			break
		fi
		if [ "$before" != "$after" ]; then
			echo "!! $target found a failing input, kept in $dir:"
			comm -13 <(echo "$before") <(echo "$after")
			failed=1
			rm -f "$out"
			break
		fi
		if grep -q 'context deadline exceeded' "$out" && go test -count=1 -run "^$target\$" "$pkg" >/dev/null; then
			echo "!! $target: a bare 'context deadline exceeded' with no input written (golang/go#75804); corpus replays clean"
			rm -f "$out"
			if [ "$attempt" -eq 2 ]; then failed=1; fi
			continue
		fi
		failed=1
		rm -f "$out"
		break
	done
done
exit $failed
